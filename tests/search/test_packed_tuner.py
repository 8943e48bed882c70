"""KerasTuner trials packed into the pool (Note [Packed KerasTuner trials] in
tensile_tf/search/packed_tuner.py): the same oracle, the same seeds, trials two at a time as
jobs; the search must score every trial as KerasTuner's own sequential search does (the trials
train bit for bit like model.fit: shuffle=False, whole batches, deterministic ops), find the same
best trial, give KerasTuner's own results and best models, and resume from its directory without
redoing finished trials."""
import threading

import numpy as np
import pytest

import tensile_tf

tensile_tf.install()  # the pool becomes TensorFlow's allocator: before any TF op
import keras  # noqa: E402
import keras_tuner  # noqa: E402

from tensile_tf.search.packed_tuner import PackedRandomSearch  # noqa: E402
from tensile_tf.tf.determinism import enable_deterministic_training  # noqa: E402

enable_deterministic_training()

rng = np.random.default_rng(0)
X = rng.normal(size=(256, 16)).astype(np.float32)
Y = (X[:, :4].argmax(axis=1)).astype(np.int32)
XV = rng.normal(size=(64, 16)).astype(np.float32)
YV = (XV[:, :4].argmax(axis=1)).astype(np.int32)
FIT = dict(epochs=2, batch_size=32, validation_data=(XV, YV), shuffle=False, verbose=0)


def build(hp):
    keras.utils.set_random_seed(0)   # seeded by the hypermodel: the same model packed or not
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(hp.Choice("units", [8, 16, 32]),
                                                                      activation="relu"),
                              keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(hp.Choice("lr", [0.01, 0.003])), jit_compile=False,
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class MeetTheSecondTrial(keras.callbacks.Callback):
    """Holds the first trial's job after its second step until the second trial's job has begun
    training (an event its own callback records, not a sleep), so that two trials run at once
    whatever the machine's speed. Class attributes: KerasTuner deep-copies each trial's
    callbacks. The wait's timeout only keeps a broken packing from hanging the suite."""

    begun: list = []
    second_began = threading.Event()

    def on_train_begin(self, logs=None):
        MeetTheSecondTrial.begun.append(1)
        if len(MeetTheSecondTrial.begun) >= 2:
            MeetTheSecondTrial.second_began.set()

    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:   # in the job's thread (the first step runs in the host's, as the probe)
            MeetTheSecondTrial.second_began.wait(timeout=60)


def scores(tuner) -> dict:
    return {tuple(sorted(t.hyperparameters.values.items())): t.score for t in tuner.oracle.trials.values()}


@pytest.fixture(scope="module")
def searches(tmp_path_factory):
    d = tmp_path_factory.mktemp("kt")
    sequential = keras_tuner.RandomSearch(build, objective="val_loss", max_trials=4, seed=7, directory=str(d),
                                          project_name="sequential")
    sequential.search(X, Y, **FIT)
    packed = PackedRandomSearch(build, objective="val_loss", max_trials=4, seed=7, directory=str(d),
                                project_name="packed", concurrent_trials=2)
    packed.search(X, Y, callbacks=[MeetTheSecondTrial()], **FIT)
    return sequential, packed, d


def test_packed_trials_score_as_sequential_ones_and_find_the_same_best(searches):
    sequential, packed, _ = searches
    # the second trial was admitted beside the held first one (on its estimated needs) and began
    assert MeetTheSecondTrial.second_began.is_set() and packed.last_run.most_jobs_running == 2
    assert packed.packing["trials"] == 4 and packed.packing["retried_alone"] == 0
    assert len(packed.last_run.jobs) == 4 and all(j.status.value == "finished" for j in packed.last_run.jobs)
    assert len(scores(packed)) == 4 and scores(packed) == scores(sequential)
    best = packed.get_best_hyperparameters()[0].values
    assert best == sequential.get_best_hyperparameters()[0].values
    # KerasTuner's own best model (its best-epoch checkpoint, written by its callback in the job)
    model = packed.get_best_models()[0]
    assert model.predict(XV[:4], verbose=0).shape == (4, 4)
    packed.results_summary(num_trials=2)


def test_a_packed_search_resumes_without_redoing_finished_trials(searches):
    _, packed, d = searches
    resumed = PackedRandomSearch(build, objective="val_loss", max_trials=6, seed=7, directory=str(d),
                                 project_name="packed", concurrent_trials=2, overwrite=False)
    assert len(resumed.oracle.trials) == 4                 # reloaded from the project directory
    resumed.search(X, Y, **FIT)
    assert resumed.packing["trials"] == 2                  # only the two new ones ran
    assert len(resumed.oracle.trials) == 6
    assert all(t.status == "COMPLETED" for t in resumed.oracle.trials.values())


def test_packed_hyperband_continues_trials_from_their_checkpoints(tmp_path):
    """Hyperband's later rounds load an earlier trial's best checkpoint and train on from
    initial_epoch: both pass through the packed fit. Every trial, by its id, has the sequential
    Hyperband's hyperparameters and score (Note [Promotions wait for their round])."""
    from tensile_tf.search.packed_tuner import PackedHyperband

    hyperband = dict(objective="val_loss", max_epochs=4, factor=2, hyperband_iterations=1, seed=3,
                     directory=str(tmp_path))
    tuner = PackedHyperband(build, project_name="hb", concurrent_trials=2, **hyperband)
    tuner.search(X, Y, batch_size=32, validation_data=(XV, YV), shuffle=False, verbose=0)
    sequential = keras_tuner.Hyperband(build, project_name="hb-sequential", **hyperband)
    sequential.search(X, Y, batch_size=32, validation_data=(XV, YV), shuffle=False, verbose=0)
    by_id = [{tid: (t.hyperparameters.values, t.score) for tid, t in s.oracle.trials.items()}
             for s in (tuner, sequential)]
    assert len(by_id[1]) > 4 and by_id[0] == by_id[1]
    trials = list(tuner.oracle.trials.values())
    assert trials and all(t.status == "COMPLETED" for t in trials)
    continued = [t for t in trials if t.hyperparameters.values.get("tuner/initial_epoch", 0) > 0]
    assert continued, "no trial continued an earlier one"
    assert tuner.packing["retried_alone"] == 0
    assert tuner.get_best_models()[0].predict(XV[:2], verbose=0).shape == (2, 4)


class _Job:
    def __init__(self, name):
        self.name, self.on_end = name, None


class _State:
    def __init__(self, name):
        self.name = name
        self.kept_by_caller_bytes = 0


def test_a_trial_run_alone_waits_for_the_others_and_holds_new_ones_back():
    """The packing hand-off (_PackedFits) between trial threads and the host's run loop, driven
    by hand: the run loop's part is this test's thread; trial threads are real threads."""
    from tensile_tf.search.packed_tuner import _PackedFits

    fits = _PackedFits(slots=3)
    results = {}

    def trial(name, alone):
        results[name] = fits.fit(_Job(name), alone=alone)

    a = threading.Thread(target=trial, args=("a", False))
    a.start()
    assert fits.job_source().name == "a"                      # the host takes a
    b = threading.Thread(target=trial, args=("b", True))       # b must run alone
    b.start()
    assert fits.waiting(lambda f: f.alone == 1)                # b has asked (issue 57: before, the check below
    assert fits.job_source() is None                           # could pass before b asked): a runs, b waits
    fits.on_end(_State("a"))
    a.join()
    assert fits.job_source().name == "b"                       # alone, once a has ended
    c = threading.Thread(target=trial, args=("c", False))
    c.start()
    assert fits.waiting(lambda f: f.held == 1)                 # c has asked, and waits
    assert fits.job_source() is None                           # c is held back while b runs alone
    fits.on_end(_State("b"))
    b.join()
    assert fits.job_source().name == "c"
    fits.on_end(_State("c"))
    c.join()
    for _ in range(3):
        fits.slot_done()
    assert fits.job_source() is None and set(results) == {"a", "b", "c"}


def test_a_trial_out_of_memory_beside_others_is_retried_alone_and_counted(tmp_path):
    from tensile_tf.runtime import JobStatus
    from tensile_tf.search.packed_tuner import PackedRandomSearch

    tuner = PackedRandomSearch(build, objective="val_loss", max_trials=1, directory=str(tmp_path), project_name="oom")
    asked = []

    class Fits:   # the host's answers: out of memory beside others, then finished alone
        def fit(self, job, *, alone):
            asked.append(alone)
            state = _State(job.name)
            state.status = JobStatus.finished if alone else JobStatus.failed
            state.error_type, state.error = (None, None) if alone else ("ResourceExhaustedError", "OOM")
            return state

    tuner._fits = Fits()
    trial = tuner.oracle.create_trial("t")
    model = build(trial.hyperparameters)
    assert tuner._fit_in_pool(trial, model, X, Y, batch_size=32, epochs=1) is not None
    assert asked == [False, True] and tuner.packing["retried_alone"] == 1


def test_an_oracle_call_that_raised_does_not_leave_keras_tuners_lock_held():
    """KerasTuner's ``synchronized`` keeps the oracle's lock when the call raises; a
    slot that fails releases it, so the other slots' oracle calls do not wait forever."""
    from keras_tuner.src.engine import oracle as kt_oracle

    from tensile_tf.search.packed_tuner import _release_oracle_lock

    class Failing(keras_tuner.oracles.RandomSearchOracle):
        @kt_oracle.synchronized
        def create_trial(self, tuner_id):
            raise RuntimeError("injected")

    oracle = Failing(objective="val_loss", max_trials=1)
    with pytest.raises(RuntimeError, match="injected"):
        oracle.create_trial("t")
    assert kt_oracle.LOCKS[oracle].locked()          # what KerasTuner leaves behind
    _release_oracle_lock(oracle)
    assert not kt_oracle.LOCKS[oracle].locked() and kt_oracle.THREADS[oracle] is None
    other = threading.Thread(target=_release_oracle_lock, args=(oracle,))   # another thread's: left alone
    kt_oracle.LOCKS[oracle].acquire()
    kt_oracle.THREADS[oracle] = threading.current_thread().name
    other.start()
    other.join()
    assert kt_oracle.LOCKS[oracle].locked()
    _release_oracle_lock(oracle)
