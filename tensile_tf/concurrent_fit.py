"""``tensile_tf.fit_concurrently``: several compiled Keras models trained at once in one pool,
from a script, with ``tensile run``'s progress bars, summary table and outputs.

    import tensile_tf
    tensile_tf.install("2GiB")          # before TensorFlow's first op
    ...build and compile models...
    fitted = tensile_tf.fit_concurrently(
        [tensile_tf.KerasFit("mlp", mlp, x, y, batch_size=64, epochs=5, callbacks=[...]),
         tensile_tf.KerasFit("cnn", cnn, x_img, y, batch_size=64, epochs=5)],
        out_dir="runs/keras")
    fitted.histories["mlp"].history["loss"]

Each model trains as ``model.fit`` would (Note [fit's loop in a job] in
tensile_tf/jobs/keras_fit.py). Run settings are ``tensile run``'s ``run:`` keys
(``planner="tensile"``, ``admission="salus"``, ...).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence


class KerasFit:
    """One model to train: ``model.fit(x, y, **fit_args)``'s arguments and the job's name."""

    def __init__(self, name: str, model: Any, x: Any = None, y: Any = None, **fit_args: Any):
        self.name, self.model, self.x, self.y, self.fit_args = name, model, x, y, fit_args


@dataclass
class ConcurrentFit:
    """What ``fit_concurrently`` returns: the run's record (results.json's content) and each
    job's ``keras.callbacks.History``; ``paths`` the files written (with ``out_dir``)."""

    result: Any
    histories: dict[str, Any]
    paths: dict[str, Path]

    @property
    def finished(self) -> bool:
        from tensile_tf.runtime import JobStatus

        return all(s.status in (JobStatus.finished, JobStatus.stopped) for s in self.result.jobs)


def fit_concurrently(fits: Sequence[KerasFit], *, pool: int | str | None = None, out_dir: str | Path | None = None,
                     progress: bool = True, **run_settings: Any) -> ConcurrentFit:
    """Trains the models together in the device pool (sized by ``pool`` if it does not exist
    yet) and returns their Histories and the run's record. ``progress``: ``tensile run``'s bars
    and summary table on the terminal. ``out_dir``: write results.json, trace.json, memory.png
    and tensorboard/ there, as ``tensile run`` does."""
    from tensile_tf.reports.console import RichProgress, summary_table, wide_console
    from tensile_tf.jobs.job import Job
    from tensile_tf.reports.outputs import write_outputs
    from tensile_tf.runtime import JobHost

    names = [f.name for f in fits]
    if len(set(names)) != len(names):
        raise ValueError(f"fit_concurrently: job names must differ (got {names})")
    jobs = [Job.from_keras(f.name, f.model, f.x, f.y, **f.fit_args) for f in fits]
    console = wide_console() if progress else None
    bars = RichProgress(console) if progress else None
    host = JobHost(pool_bytes=pool, progress=bars, **run_settings)
    for job in jobs:
        host.submit(job)
    if bars is not None:
        with bars:
            result = host.run()
        summary_table(result, console)
    else:
        result = host.run()
    paths = write_outputs(result, out_dir) if out_dir is not None else {}
    return ConcurrentFit(result, {job.name: job.history for job in jobs}, paths)
