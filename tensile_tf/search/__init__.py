"""Hyperparameter search on the shared device pool: Optuna ask/tell drivers
whose trials train concurrently in one process, as many as admission allows.

    config.py     the YAML ``search:`` section (space in Optuna's terms)
    objective.py  step records -> objective metric (final and intermediate)
    samplers.py   grid / random / TPE samplers and the median pruner
    storage.py    SQLite or shared storage; interrupted trials (a Note)
    driver.py     SearchDriver, run_search: the ask/tell loop on a JobHost
    trials.py     a trial's run and the search's result (TrialRun, SearchResult), OOM retries
    reporter.py   the thread that writes intermediate values and heartbeats to the study
    results.py    results.json and Optuna's plots (objective, params, importances, ...)
    (the command, ``tensile search``, is tensile_tf/cli/search.py)

``from tensile_tf.search import run_search`` imports TensorFlow (through the
host): import tensile_tf first, as always.
"""


def __getattr__(name):
    # Lazy, so that `tensile_tf.search.config` stays importable without TensorFlow.
    if name in ("run_search", "SearchDriver", "SearchResult"):
        from tensile_tf.search import driver

        return getattr(driver, name)
    raise AttributeError(name)


__all__ = ["run_search", "SearchDriver", "SearchResult"]
