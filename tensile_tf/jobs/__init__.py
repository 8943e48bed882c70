"""What a job is and what it trains: ``job`` (``Job``, ``TrainStep`` and how
a YAML ``JobSpec`` becomes one), ``datasets`` (the data kinds a YAML job
reads: npz, npy, tfrecord, image folders, digits) and ``zoo`` (the small
models the examples and tests name as ``tensile_tf.jobs.zoo:NAME``).

``from tensile_tf.jobs import Job, TrainStep`` is the Python API; the names
load TensorFlow on first use, not at ``import tensile_tf.jobs``."""
from __future__ import annotations

from typing import Any

_JOB_NAMES = frozenset({"Job", "TrainStep", "JobBuildError", "JobDoesNotFit", "supervised_train_step"})


def __getattr__(name: str) -> Any:
    if name in _JOB_NAMES:
        from tensile_tf.jobs import job

        return getattr(job, name)
    raise AttributeError(f"module 'tensile_tf.jobs' has no attribute {name!r}")


__all__ = sorted(_JOB_NAMES)
