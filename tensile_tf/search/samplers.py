"""Optuna samplers and pruners from the search configuration.

Seeds: a fixed seed makes a fresh single-process search repeatable. A
resumed search, or a worker joining a shared study, would replay the first
draws of the original process and so repeat finished trials; there the seed
is mixed with the trials already in the study and the worker's identity.
TPE runs with ``constant_liar`` because trials run concurrently: a running
trial counts as a poor result, so concurrent asks do not all crowd the same
promising point.
"""
from __future__ import annotations

import hashlib

import optuna

from tensile_tf.search.config import PruningSpec, SamplerName, SamplerSpec, grid_search_space


def effective_seed(seed: int | None, *, existing_trials: int, worker: str | None) -> int | None:
    if seed is None or (existing_trials == 0 and worker is None):
        return seed
    digest = hashlib.sha256(f"{seed}:{existing_trials}:{worker}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def make_sampler(spec: SamplerSpec, space: dict, *, existing_trials: int = 0,
                 worker: str | None = None) -> optuna.samplers.BaseSampler:
    seed = effective_seed(spec.seed, existing_trials=existing_trials, worker=worker)
    if spec.name == SamplerName.grid:
        return optuna.samplers.GridSampler(grid_search_space(space), seed=seed)
    if spec.name == SamplerName.random:
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.n_startup_trials,
                                      constant_liar=True)


def make_pruner(spec: PruningSpec) -> optuna.pruners.BasePruner:
    if not spec.enabled:
        return optuna.pruners.NopPruner()
    # Values are reported only every interval_steps steps, so the pruner checks
    # every *reported* step (interval_steps=1): Optuna's own interval counts
    # from the warmup and could fall between reports and never fire.
    return optuna.pruners.MedianPruner(n_startup_trials=spec.n_startup_trials,
                                       n_warmup_steps=spec.n_warmup_steps, interval_steps=1)
