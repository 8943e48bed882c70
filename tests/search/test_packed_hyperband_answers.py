"""Note [Promotions wait for their round] (tensile_tf/search/packed_tuner.py), on KerasTuner's own
HyperbandOracle alone, no model trained: two slots ask for trials while the other's trial still
runs, and their trials end out of order (the last started ends first). With the oracle's answers
wrapped, the trials handed out (ids, hyperparameters, and so the scores) are the sequential
search's, where each trial ends before the next is asked for; the control, the same schedule on
the oracle as KerasTuner leaves it, hands out others."""
import json

import keras_tuner

from tensile_tf.search.packed_tuner import _promoting_whole_rounds


def oracle(tmp_path, name: str, wrapped: bool):
    hp = keras_tuner.HyperParameters()
    hp.Float("lr", 1e-4, 1e-1, sampling="log")
    hp.Int("units", 8, 512, step=8)
    o = keras_tuner.oracles.HyperbandOracle(objective=keras_tuner.Objective("score", "max"), max_epochs=9,
                                            factor=3, hyperband_iterations=1, seed=5, hyperparameters=hp)
    o._set_project_dir(str(tmp_path), name)
    if wrapped:
        o.populate_space = _promoting_whole_rounds(o, o.populate_space)
    return o


def score(trial) -> float:
    """What training the trial would score: a function of its hyperparameters and epochs only."""
    values = trial.hyperparameters.values
    key = json.dumps({k: v for k, v in values.items() if not k.startswith("tuner/")}, sort_keys=True)
    return (sum(map(ord, key)) * 7919 % 1000) / 1000 + values.get("tuner/epochs", 0) / 100


def end(o, trial) -> None:
    o.update_trial(trial.trial_id, {"score": score(trial)})
    trial.status = "COMPLETED"
    o.end_trial(trial)


def handed_out(trial) -> tuple:
    return trial.trial_id, json.dumps(trial.hyperparameters.values, sort_keys=True)


def sequential(o) -> list:
    out = []
    while True:
        trial = o.create_trial("tuner0")
        if trial.status == "STOPPED":
            return out
        out.append(handed_out(trial))
        end(o, trial)


def packed(o, slots: int = 2) -> tuple[list, int]:
    """Each free slot asks; then the trial started last ends. Returns the trials handed out
    and how many answers were IDLE."""
    out, running, idle, stopped = [], [], 0, set()
    while len(stopped) < slots:
        for k in range(slots):
            tuner_id = f"tuner0-packed{k}"
            if k in stopped or any(t for slot, t in running if slot == k):
                continue
            trial = o.create_trial(tuner_id)
            if trial.status == "STOPPED":
                stopped.add(k)
            elif trial.status == "IDLE":
                idle += 1
            else:
                out.append(handed_out(trial))
                running.append((k, trial))
        if running:
            end(o, running.pop()[1])
    return out, idle


def test_packed_hyperband_hands_out_the_sequential_searchs_trials(tmp_path):
    expected = sequential(oracle(tmp_path, "sequential", wrapped=False))
    got, idle = packed(oracle(tmp_path, "packed", wrapped=True))
    assert len(expected) == 23
    assert got == expected
    assert idle > 0   # the wrapped oracle made a slot wait (a promotion or a bracket held back)


def test_control_the_oracle_as_keras_tuner_leaves_it_hands_out_other_trials(tmp_path):
    expected = sequential(oracle(tmp_path, "sequential", wrapped=False))
    got, _ = packed(oracle(tmp_path, "packed", wrapped=False))
    assert got != expected
