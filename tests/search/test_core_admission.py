"""Note [Admitting by the cores]: the meter and the search driver's rule,
driven by the test's own clocks (nothing here depends on how fast this
machine is or how busy it is)."""
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from tensile_tf.runtime.core_meter import MIN_WINDOW_S, SATURATED, CoreMeter
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
                          host=SimpleNamespace(states=[], progress=None), **kwargs)
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
