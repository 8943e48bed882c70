"""Note [Admitting by the cores] and Note [Admitting by marginal throughput]:
the meter, the gain and the search driver's rule, driven by the test's own
clocks and step records (nothing here depends on how fast this machine is or
how busy it is)."""
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tensile_tf.runtime.core_meter import (MIN_WINDOW_S, SATURATED, CoreAdmission, CoreMeter, MarginalGain,
                                           TrialSteps, thread_cpu_clock)
from tensile_tf.search.driver import SearchDriver

DENSE = {"model": {"train_step_factory": "tests.job_factories:dense_regression", "args": {"width": 32}},
         "steps": 30, "name": "dense"}


class Clocks:
    """Wall and CPU time the test advances by hand."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def advance(self, wall_s: float, busy_cores: float) -> None:
        self.wall += wall_s
        self.cpu += wall_s * busy_cores

    def meter(self, cores: int = 2) -> CoreMeter:
        return CoreMeter(cores, cpu=lambda: self.cpu, wall=lambda: self.wall)


def test_the_share_is_read_over_a_sliding_window_that_starts_after_the_last_admission():
    clocks = Clocks()
    meter = clocks.meter()
    assert meter.busy_share() is None                 # no window yet
    clocks.advance(MIN_WINDOW_S, busy_cores=2.0)
    assert meter.busy_share() == pytest.approx(1.0) and meter.saturated()
    clocks.advance(MIN_WINDOW_S, busy_cores=0.5)      # the window slides to the last MIN_WINDOW_S
    assert meter.busy_share() == pytest.approx(0.25) and meter.saturated() is False
    meter.admitted()                                  # a job started: its load is not known yet
    clocks.advance(MIN_WINDOW_S / 2, busy_cores=2.0)
    assert meter.busy_share() is None and meter.saturated() is None
    clocks.advance(MIN_WINDOW_S / 2, busy_cores=2.0)
    assert meter.busy_share() == pytest.approx(1.0)
    # readings every 0.1 s: the window is the newest one at least MIN_WINDOW_S old
    for _ in range(10):
        clocks.advance(0.1, busy_cores=0.2)
        meter.busy_share()
    assert meter.busy_share() == pytest.approx(0.1)
    assert SATURATED == 0.9


def _driver(clocks: Clocks, **kwargs) -> SearchDriver:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    driver = SearchDriver(study, DENSE, {"batch_size": CategoricalDistribution([16, 32])}, n_trials=8,
                          host=SimpleNamespace(states=[], progress=None, clock=SimpleNamespace(now=lambda: clocks.wall)),
                          **kwargs)
    if driver.cores is not None:
        driver.cores.meter = clocks.meter()
    return driver


def test_no_trial_starts_beside_running_ones_while_the_cores_are_busy():
    clocks = Clocks()
    driver = _driver(clocks)
    first = driver.job_source()
    assert first is not None          # nothing runs: a trial always starts
    driver._started(driver.runs[0])   # the host started it (what a progress update tells the driver)
    assert driver.job_source() is None and driver.cores.waits == 0   # too soon to tell: waits, not counted
    clocks.advance(1.0, busy_cores=1.95)
    assert driver.job_source() is None and driver.cores.waits == 1   # saturated: waits
    clocks.advance(0.25, busy_cores=2.0)
    assert driver.job_source() is None and driver.cores.waits == 1   # the same wait, counted once
    clocks.advance(1.0, busy_cores=0.6)
    second = driver.job_source()                                     # cores idle again: packs
    assert second is not None and second.name != first.name
    driver._started(driver.runs[1])
    clocks.advance(1.0, busy_cores=2.0)
    assert driver.job_source() is None and driver.cores.waits == 2
    # once no trial of the driver is in flight, the next starts whatever the meter says
    for run in driver.runs:
        run.told = optuna.trial.TrialState.COMPLETE
    assert driver.job_source() is not None


def test_core_admission_off_packs_whatever_the_cores_do():
    clocks = Clocks()
    driver = _driver(clocks, admit_by_cores=False)
    assert driver.cores is None
    assert driver.job_source() is not None
    driver._started(driver.runs[0])
    clocks.advance(1.0, busy_cores=2.0)
    assert driver.job_source() is not None


def test_while_the_window_is_young_the_share_is_predicted_from_the_last_share_per_trial():
    """Note [Starts not held by the window]: trials that leave the cores idle
    start one after another without waiting for a window each; trials that
    keep them busy still wait."""
    clocks = Clocks()
    driver = _driver(clocks)
    assert driver.job_source() is not None
    driver._started(driver.runs[0])
    assert driver.job_source() is None            # one trial's share is not known yet: waits for a window
    clocks.advance(1.0, busy_cores=0.2)           # 0.1 of the cores, one trial
    assert driver.job_source() is not None
    driver._started(driver.runs[1])               # the share per trial: 0.1
    for k in (2, 3):                              # no time passes: predicted 0.2, then 0.3
        assert driver.job_source() is not None, k
        driver._started(driver.runs[k])
    assert driver.cores.predicted_starts == 2 and driver.cores.waits == 0
    # trials that keep the cores busy: two predicted at 2 x 0.8 of the cores wait for a measured window
    busy = _driver(Clocks())
    busy.cores.meter = (clocks := Clocks()).meter()
    assert busy.job_source() is not None
    busy._started(busy.runs[0])
    clocks.advance(1.0, busy_cores=1.6)
    assert busy.cores.meter.busy_share() == pytest.approx(0.8)
    assert busy.job_source() is not None           # 0.8 measured: below SATURATED
    busy._started(busy.runs[1])
    assert busy.job_source() is None and busy.cores.waits == 1 and busy.cores.predicted_starts == 0
    clocks.advance(1.0, busy_cores=1.0)            # measured again: half the cores idle
    assert busy.job_source() is not None


def _steps(start: float, end: float, step_s: float) -> list:
    """Step records back to back from ``start`` until ``end``."""
    out, t = [], start
    while t + step_s <= end + 1e-9:
        out.append(SimpleNamespace(start_s=t, duration_s=step_s))
        t += step_s
    return out


def _start_beside_one(slowdown: float, *, newcomer_steps_until: float = 6.0, at: float = 0.0,
                      names: str = "ab") -> list[TrialSteps]:
    """A trains alone (0.1 s steps); B is handed over 2 s later, trains from
    2.5 s (its build, trace and probe between), and A's steps then take ``slowdown`` x."""
    a = _steps(at, at + 2.5, 0.1) + _steps(at + 2.5, at + newcomer_steps_until, 0.1 * slowdown)
    b = _steps(at + 2.5, at + newcomer_steps_until, 0.1)
    return [TrialSteps(names[0], at, at, None, a), TrialSteps(names[1], at + 2.0, at + 2.5, None, b)]


def test_a_start_beside_saturated_cores_is_judged_by_how_much_it_slowed_the_running_trials():
    """Note [Admitting by marginal throughput]: compute-bound, A's steps take 2x
    beside B: two trials do what one did, no gain; waiting on overheads, 1.2x:
    two do 1.67x what one did. One measurement refuses nothing; two do."""
    compute = MarginalGain()
    compute.update(_start_beside_one(2.0))
    assert compute.gain(2) == pytest.approx(1.0) and compute.allows(1)
    compute.update(_start_beside_one(2.0, at=10.0, names="cd"))
    assert compute.slowdowns == {2: [pytest.approx(2.0)] * 2}
    assert not compute.allows(1) and not compute.allows(2)   # nor any start to more trials
    overhead = MarginalGain()
    overhead.update(_start_beside_one(1.2))
    overhead.update(_start_beside_one(1.2, at=10.0, names="cd"))
    assert overhead.gain(2) == pytest.approx(2 / 1.2) and overhead.allows(1)
    # one start at a time while a start's slowdown is measured, unless its level gained already
    fresh = MarginalGain()
    assert fresh.gain(2) is None and fresh.allows(1)
    fresh.update(_start_beside_one(1.2, newcomer_steps_until=2.9))   # A has 3 steps since B trains
    assert fresh.pending and not fresh.allows(1) and not fresh.allows(2)
    fresh.update(_start_beside_one(1.2))
    assert not fresh.pending and fresh.gain(2) == pytest.approx(2 / 1.2)
    overhead.update(_start_beside_one(1.2, newcomer_steps_until=2.9, at=20.0, names="ef"))
    assert overhead.pending and overhead.allows(1) and not overhead.allows(2)


def test_a_start_cut_short_by_another_event_is_measured_on_what_ran_or_not_at_all():
    trials = _start_beside_one(2.0)
    c = TrialSteps("c", 3.35, None, None, [])   # handed over 0.85 s after B began: A ran 2 steps past the 2 left out
    judge = MarginalGain()
    judge.update([*trials, c])
    assert judge.slowdowns == {2: [pytest.approx(2.0)]}
    assert judge.pending   # C is handed over and not training yet: its own start is still to measure
    too_soon = TrialSteps("c", 3.0, None, None, [])   # A ran no whole step past the 2 left out
    judge = MarginalGain()
    judge.update([*trials, too_soon])
    assert judge.slowdowns == {} and "b" in judge._settled


def test_beside_saturated_cores_the_driver_explores_starts_and_stops_where_they_did_not_gain():
    clocks = Clocks()
    driver = _driver(clocks)
    assert driver.job_source() is not None
    a = driver.runs[0]
    a.state = SimpleNamespace(admitted_at_s=0.0, ended_at_s=None, records=_steps(0.0, 2.0, 0.1))
    driver._started(a)
    clocks.advance(2.0, busy_cores=1.9)           # A alone keeps 0.95 of the cores busy
    for n, t in enumerate((2.0, 10.0), start=1):  # twice: a start beside A, A's steps 2x as long after it
        assert driver.job_source() is not None and driver.cores.gain_starts == n   # explored
        new = driver.runs[n]
        driver._started(new)
        clocks.advance(0.5, busy_cores=2.0)
        assert driver.job_source() is None        # not training yet: nothing else explored beside it
        new.state = SimpleNamespace(admitted_at_s=t + 0.5, ended_at_s=None, records=_steps(t + 0.5, t + 4.0, 0.2))
        a.state.records[:] = [r for r in a.state.records if r.start_s < t + 0.5] + _steps(t + 0.5, t + 4.0, 0.2)
        clocks.advance(3.5, busy_cores=2.0)
        new.state.ended_at_s, new.told = t + 4.0, optuna.trial.TrialState.COMPLETE   # it ends: A alone again
        a.state.records += _steps(t + 4.0, t + 8.0, 0.1)
        clocks.advance(4.0, busy_cores=1.9)
    # two did what one did, twice: no start beside busy cores from now on
    assert driver.job_source() is None and driver.cores.gain_starts == 2
    assert driver.cores.gain.slowdowns == {2: [pytest.approx(2.0)] * 2}
    clocks.advance(1.0, busy_cores=1.0)           # cores idle again: the share alone lets it start
    assert driver.job_source() is not None


def test_a_plan_fits_one_more_trial_in_only_where_one_more_adds_throughput():
    """Note [Plans only for idle cores] (tensile_tf/runtime/planning.py): what the host asks before it
    plans a trial in beside running ones, or captures one for such a plan. Nothing running: yes. Not measured yet, or busy cores with
    no start to one more measured to gain: no, though the driver's rule still lets that start be
    explored. Idle cores, or starts to one more that gained the margin as often as a refusal needs: yes."""
    clocks = Clocks()
    cores = CoreAdmission(clocks.meter())
    assert cores.busy_for_a_plan(0) is None
    cores.started(0)
    assert "nothing is measured" in cores.busy_for_a_plan(1)
    clocks.advance(1.0, busy_cores=1.9)
    why = cores.busy_for_a_plan(1)
    assert "keep the cores busy" in why and "to 2 trials" in why
    assert cores.allows(1) and cores.gain_starts == 1   # the driver explores the start all the same
    clocks.advance(1.0, busy_cores=1.0)
    assert cores.busy_for_a_plan(1) is None             # idle cores
    # a trial starting beside the running one (a capture decided for a later plan): at as much a
    # trial, the two keep the cores busy, and nothing says a third adds throughput
    assert "with the newcomer" in cores.busy_for_a_plan(1, newcomers=1)
    assert "nothing is measured" in cores.busy_for_a_plan(0, newcomers=1)   # the first trial
    clocks.advance(1.0, busy_cores=1.9)
    assert cores.busy_for_a_plan(1, trials=_start_beside_one(1.2)) is not None   # one start measured: not yet
    assert cores.busy_for_a_plan(1, trials=_start_beside_one(1.2, at=10.0, names="cd")) is None   # two gained 2 / 1.2
    assert cores.gain.slowdowns == {2: [pytest.approx(1.2)] * 2}
    assert cores.busy_for_a_plan(2) is not None         # nothing known of starts to 3
    compute = CoreAdmission(clocks.meter())
    compute.started(0)
    clocks.advance(1.0, busy_cores=1.9)
    compute.busy_for_a_plan(1, trials=_start_beside_one(2.0))
    assert compute.busy_for_a_plan(1, trials=_start_beside_one(2.0, at=10.0, names="cd")) is not None   # no gain


def test_the_training_share_leaves_out_the_run_loops_cpu_time():
    """Note [Plans only for idle cores]: the run loop's builds, traces and captures are setting up,
    not training; the share a plan is decided on leaves its thread's CPU time out."""
    clocks = Clocks()
    loop = {"cpu": 0.0}
    meter = CoreMeter(2, cpu=lambda: clocks.cpu, wall=lambda: clocks.wall, loop_cpu=lambda: loop["cpu"])
    meter.busy_share()
    clocks.advance(1.0, busy_cores=1.9)
    loop["cpu"] += 0.9                      # of which the run loop set a trial up for 0.9 s
    assert meter.busy_share() == pytest.approx(0.95)
    assert meter.busy_share(training_only=True) == pytest.approx(0.5)


def test_a_threads_cpu_clock_reads_that_thread_from_any_other():
    import threading
    import time

    mine = thread_cpu_clock()
    box, done = {}, threading.Event()

    def spin():
        box["clock"] = thread_cpu_clock()
        while time.thread_time() < 0.3:
            pass
        box["spun"] = True
        done.wait(60)

    before = mine()
    worker = threading.Thread(target=spin)
    worker.start()
    while "spun" not in box:
        time.sleep(0.01)
    assert box["clock"]() >= 0.3          # the worker's CPU time, read from this thread
    done.set()
    worker.join()
    assert mine() - before < 0.3          # this thread slept meanwhile
