"""Keras users' own compiled models as jobs: ``Job.from_keras``, with ``fit``'s callbacks.

Note [fit's loop in a job]
A job made by ``from_keras`` trains what ``model.fit`` trains: its step is the model's own
``train_step`` (the compiled loss, optimizer and metrics; the host wraps it in its tf.function,
so the capture, plans and node groups treat it as every job's step), and its hooks run fit's
loop around the host's steps, at fit's points and with fit's logs:

- before a step: ``on_train_begin`` (first step), at an epoch's first step ``reset_metrics``
  and ``on_epoch_begin``, then ``on_train_batch_begin``;
- after a step: ``on_train_batch_end`` with the metrics' running results (fit's batch logs);
  at an epoch's last step the epoch logs, validation by ``model.evaluate`` (``val_*``) and
  ``on_epoch_end``; after the last step, or when a callback set ``model.stop_training``,
  ``optimizer.finalize_variable_values`` and ``on_train_end``. The job then stops at that step
  boundary (status ``stopped`` when a callback ended it early).

The hooks run in the job's thread (the first step's in the host's, where the job is probed), with
the variables a plan keeps on the host brought back for the duration (so a callback that saves or
reads weights sees the real ones). Each job's ``keras.callbacks.History`` is ``job.history``.

Where it is not ``fit`` bit for bit, and why:
- every step has one batch shape (the planned graph is traced for it), so an epoch's last
  partial batch is dropped: ``steps_per_epoch = len(x) // batch_size``. With ``len(x)`` a
  multiple of the batch size the batches are fit's;
- ``shuffle=True`` shuffles each epoch with its own seeded generator (``seed``), not fit's; use
  ``shuffle=False`` (or a ``tf.data.Dataset``) to compare with fit;
- the step runs without XLA (the planner rewrites TensorFlow graph ops): a model compiled with
  ``jit_compile=True`` (as Keras leaves it where a device supports XLA) computes the same function
  with other rounding, and a ``UserWarning`` says so when the job is made;
- ``verbose`` reaches the callbacks' ``params`` as fit's does, but the run's progress lines take
  the place of Keras' progress bar; ``validation_freq`` and ``validation_steps`` are fit's;
- the loss the host records per step is fit's batch log ``loss``: the running mean since the
  epoch began.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import tensorflow as tf


class KerasJobError(ValueError):
    """A model or its data cannot become a job; the message says what to change."""


def _floats(logs: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in logs.items()}


@dataclass
class FitLoop:
    """fit's loop around one job's steps (Note [fit's loop in a job])."""

    model: Any
    steps_per_epoch: int
    epochs: int
    callbacks: Any                      # keras.callbacks.CallbackList (with History)
    validation: tuple | None = None     # (x, y[, sample_weight]) or a tf.data.Dataset
    validation_batch_size: int | None = None
    initial_epoch: int = 0              # fit's initial_epoch: epochs initial_epoch .. epochs - 1 run
    steps: int | None = None            # a step count instead of whole epochs (the last one partial)
    validation_freq: int = 1            # fit's: validate at the end of every this many epochs
    validation_steps: int | None = None  # fit's: batches of validation data each time (None: all)
    logs: dict[str, float] = field(default_factory=dict)
    _begun_batch: int = -1
    _ended: bool = False
    _own_test_step: tuple | None = None   # (the model's instance test_step or None,), kept by attribute_to

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.steps_per_epoch * (self.epochs - self.initial_epoch)

    @property
    def history(self):
        return self.model.history

    def before(self, state: Any, on_device: Callable[[], ContextManager]) -> None:
        step = state.steps_done
        if step == self._begun_batch:    # a probe step tried again after it ran out of memory
            return
        epoch, batch = divmod(step, self.steps_per_epoch)
        epoch += self.initial_epoch
        with on_device():
            if step == 0:
                self.model.stop_training = False
                self.callbacks.on_train_begin()
            if batch == 0:
                self.model.reset_metrics()
                self.callbacks.on_epoch_begin(epoch)
            self.callbacks.on_train_batch_begin(batch)
        self._begun_batch = step

    def after(self, state: Any, on_device: Callable[[], ContextManager]) -> None:
        if self._ended:
            return
        epoch, batch = divmod(state.steps_done - 1, self.steps_per_epoch)
        epoch += self.initial_epoch
        with on_device():
            self.logs = _floats(self.model.get_metrics_result())
            self.callbacks.on_train_batch_end(batch, self.logs)
            last = state.steps_done >= self.total_steps
            if batch == self.steps_per_epoch - 1 or self.model.stop_training or last:
                epoch_logs = dict(self.logs)
                if self.validation is not None and (epoch + 1) % self.validation_freq == 0:   # fit's _should_eval
                    epoch_logs.update(self._validate())
                self.callbacks.on_epoch_end(epoch, epoch_logs)
                self.logs = epoch_logs
            if last or self.model.stop_training:
                self.model.optimizer.finalize_variable_values(self.model.trainable_weights)
                self.callbacks.on_train_end(logs=self.logs)
                self._ended = True

    def keep_going(self, state: Any) -> bool:
        """The job's ``on_step``: False once a callback stopped training."""
        return not self.model.stop_training

    def attribute_to(self, attributed: Callable[[Callable], Callable] | None) -> None:
        """``evaluate``'s step traced as ``attributed(test_step)`` (the job's stream's
        ``JobStream.attributed``: its allocations are the job's); None puts the model's own back.
        ``test_step`` is Keras' override point; ``test_function = None`` makes ``evaluate`` trace anew."""
        model = self.model
        if self._own_test_step is None:
            self._own_test_step = (vars(model).get("test_step"),)
        own = self._own_test_step[0]
        if "test_step" in vars(model):
            delattr(model, "test_step")
        if own is not None:
            model.test_step = own
        if attributed is not None:
            model.test_step = attributed(model.test_step)
        model.test_function = None

    def run_one_validation_batch(self) -> None:
        """One batch of the job's validation, as ``evaluate`` runs it, for the probe to measure (Note
        [Work outside the steps, inside the allowance] in tensile_tf/runtime/work_outside_steps.py);
        the metrics ``evaluate`` resets (fit's running results among them) are put back after it."""
        if self.validation is None:
            return
        metric_variables = [v for m in self.model.metrics for v in m.variables]
        kept = [v.numpy() for v in metric_variables]
        try:
            self._validate(steps=1, callbacks=None)
        finally:
            for v, value in zip(metric_variables, kept):
                v.assign(value)

    def _validate(self, steps: int | None = None, callbacks: Any = "fit's") -> dict[str, float]:
        v = self.validation
        steps = steps or self.validation_steps
        callbacks = self.callbacks if callbacks == "fit's" else callbacks
        if isinstance(v, tf.data.Dataset):
            logs = self.model.evaluate(v, steps=steps, verbose=0, return_dict=True, callbacks=callbacks)
        else:
            x, y, *sw = v
            logs = self.model.evaluate(x, y, sample_weight=sw[0] if sw else None, steps=steps,
                                       batch_size=self.validation_batch_size, verbose=0, return_dict=True,
                                       callbacks=callbacks)
        return {f"val_{k}": float(val) for k, val in logs.items()}


class ArrayBatches:
    """Epochs of ``(x, y[, sample_weight])`` batches from arrays, the last partial batch
    dropped (Note [fit's loop in a job]); in order, or shuffled per epoch by ``seed``."""

    def __init__(self, arrays: Sequence[np.ndarray], batch_size: int, shuffle: bool, seed: int):
        self.arrays, self.batch_size, self.shuffle, self.seed = arrays, batch_size, shuffle, seed
        self.per_epoch = len(arrays[0]) // batch_size
        self.epoch, self.i, self.order = -1, self.per_epoch, None

    def __call__(self) -> tuple:
        if self.i >= self.per_epoch:
            self.epoch, self.i = self.epoch + 1, 0
            n = len(self.arrays[0])
            self.order = (np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle
                          else None)
        lo, hi = self.i * self.batch_size, (self.i + 1) * self.batch_size
        self.i += 1
        if self.order is None:
            return tuple(a[lo:hi] for a in self.arrays)
        idx = self.order[lo:hi]
        return tuple(a[idx] for a in self.arrays)


def _check_compiled(name: str, model: Any) -> None:
    import keras

    if not isinstance(model, keras.Model):
        raise KerasJobError(f"job {name!r}: from_keras takes a keras.Model, got {type(model).__name__}")
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise KerasJobError(f"job {name!r}: the model is not compiled; call model.compile(optimizer=..., "
                            "loss=..., metrics=[...]) first (from_keras trains with the compiled settings)")


def _split(name: str, x, y, sample_weight, validation_split: float):
    """Keras' validation_split: the last fraction of the arrays, before any shuffling."""
    if not 0.0 <= validation_split < 1.0:
        raise KerasJobError(f"job {name!r}: validation_split must be in [0, 1), got {validation_split}")
    if not validation_split:
        return x, y, sample_weight, None
    at = int(math.floor(len(x) * (1.0 - validation_split)))
    val = (x[at:], y[at:]) + ((sample_weight[at:],) if sample_weight is not None else ())
    return x[:at], y[:at], sample_weight[:at] if sample_weight is not None else None, val


def _class_weights(name: str, y: np.ndarray, class_weight: dict[int, float]) -> np.ndarray:
    labels = y.reshape(len(y), -1).argmax(axis=1) if y.ndim > 1 and y.shape[-1] > 1 else y.reshape(len(y))
    missing = sorted(set(np.unique(labels).tolist()) - set(class_weight))
    if missing:
        raise KerasJobError(f"job {name!r}: class_weight has no weight for classes {missing[:5]}")
    return np.asarray([class_weight[int(c)] for c in labels], dtype=np.float32)


def keras_fit(name: str, model: Any, x: Any = None, y: Any = None, *, dataset: Any = None,
               batch_size: int = 32, epochs: int = 1, initial_epoch: int = 0, steps_per_epoch: int | None = None,
               steps: int | None = None,
               validation_data: Any = None, validation_split: float = 0.0,
               validation_batch_size: int | None = None, callbacks: Sequence[Any] = (),
               shuffle: bool = False, seed: int = 0, class_weight: dict[int, float] | None = None,
               sample_weight: np.ndarray | None = None, verbose: int | str = "auto",
               validation_steps: int | None = None, validation_freq: int = 1) -> tuple[FitLoop, Callable, Any]:
    """fit's loop for a compiled ``keras.Model`` (Note [fit's loop in a job]; the argument
    names are fit's): the FitLoop hooks, the step function and the batches, which
    ``Job.from_keras`` makes a job of. Data: arrays ``x`` and ``y``, or a batched
    ``tf.data.Dataset`` as ``dataset`` (then ``steps_per_epoch``, unless its cardinality is
    known). ``steps`` (not fit's): train that many steps instead of whole epochs; the last epoch
    ends, with its logs and callbacks, at the last step. ``verbose`` is fit's and reaches the
    callbacks' ``params``; the run's own progress lines take the place of Keras' progress bar."""
    import keras

    _check_compiled(name, model)
    if verbose not in ("auto", 0, 1, 2):
        raise KerasJobError(f"job {name!r}: verbose must be 'auto', 0, 1 or 2 (fit's), got {verbose!r}")
    if not isinstance(validation_freq, int) or validation_freq < 1:
        raise KerasJobError(f"job {name!r}: validation_freq must be a whole number of epochs >= 1, "
                            f"got {validation_freq!r}")
    if validation_steps is not None and validation_steps < 1:
        raise KerasJobError(f"job {name!r}: validation_steps must be at least 1, got {validation_steps}")
    if getattr(model, "jit_compile", False) is True:   # said once, at submit (Note [fit's loop in a job])
        warnings.warn(f"job {name!r}: the model was compiled with jit_compile=True; the job's step runs without "
                      "XLA (the planner rewrites TensorFlow's graph ops), the same function with other rounding",
                      UserWarning, stacklevel=3)
    if steps is not None:   # a step count instead of epochs: as many epochs as it takes
        if steps < 1:
            raise KerasJobError(f"job {name!r}: steps must be at least 1, got {steps}")
        if initial_epoch:
            raise KerasJobError(f"job {name!r}: give steps or initial_epoch, not both")
    if not 0 <= initial_epoch < epochs:
        raise KerasJobError(f"job {name!r}: fit runs epochs initial_epoch .. epochs - 1, so epochs must be "
                            f"above initial_epoch >= 0 (got epochs={epochs}, initial_epoch={initial_epoch})")
    if dataset is not None:
        if x is not None or y is not None:
            raise KerasJobError(f"job {name!r}: give arrays x and y, or dataset, not both")
        if validation_split:
            raise KerasJobError(f"job {name!r}: validation_split needs arrays; give validation_data "
                                "with a dataset")
        if steps_per_epoch is None:
            cardinality = int(dataset.cardinality())
            if cardinality <= 0:
                raise KerasJobError(f"job {name!r}: the dataset's length is unknown or infinite; "
                                    "give steps_per_epoch")
            steps_per_epoch = cardinality
        batches: Any = dataset.repeat()
    else:
        if x is None or y is None:
            raise KerasJobError(f"job {name!r}: give arrays x and y (or dataset=)")
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y):
            raise KerasJobError(f"job {name!r}: x has {len(x)} examples but y has {len(y)}")
        x, y, sample_weight, split_validation = _split(name, x, y, sample_weight, validation_split)
        validation_data = validation_data if validation_data is not None else split_validation
        if class_weight is not None:
            cw = _class_weights(name, y, class_weight)
            sample_weight = cw if sample_weight is None else sample_weight * cw
        arrays = [x, y] + ([np.asarray(sample_weight, dtype=np.float32)] if sample_weight is not None else [])
        batches = ArrayBatches(arrays, batch_size, shuffle, seed)
        if batches.per_epoch < 1:
            raise KerasJobError(f"job {name!r}: {len(x)} training examples make no batch of {batch_size}; "
                                "lower batch_size")
        steps_per_epoch = min(steps_per_epoch or batches.per_epoch, batches.per_epoch)
    if validation_data is not None and not isinstance(validation_data, tf.data.Dataset):
        validation_data = tuple(validation_data)
    if steps is not None:
        epochs = -(-steps // steps_per_epoch)
    callback_list = keras.callbacks.CallbackList(list(callbacks), add_history=True, add_progbar=False,
                                                 verbose=1 if verbose == "auto" else verbose, epochs=epochs,
                                                 steps=steps_per_epoch, model=model)
    fit = FitLoop(model, steps_per_epoch, epochs, callback_list, validation_data,
                   validation_batch_size or batch_size, initial_epoch, steps, validation_freq, validation_steps)

    return fit, keras_train_step(model), batches


def keras_train_step(model: Any) -> Callable:
    """The compiled model's own step (fit's): loss, gradients, optimizer, metrics; returns fit's
    batch log ``loss``."""
    def step(*batch):
        return model.train_step(batch)["loss"]

    return step


def saved_keras_model(job: str, path: str) -> Any:
    """A YAML job's ``model: {keras_file: PATH}``: the model with its compiled settings."""
    import keras

    try:
        model = keras.models.load_model(path)
    except (OSError, ValueError) as e:
        raise KerasJobError(f"job {job!r}: model.keras_file {path!r} does not load as a Keras model ({e}); "
                            "save it with model.save('NAME.keras')") from None
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise KerasJobError(f"job {job!r}: model.keras_file {path!r} holds no compiled settings; compile the "
                            "model (optimizer, loss, metrics) before model.save")
    return model


def estimated_needs(model: Any, batch_size: int) -> tuple[int, int]:
    """(persistent, temporary) bytes guessed from the model before it ran, for admission (a
    prediction; the job's probe step then measures them): its variables with two optimizer
    slots each (Adam's; the optimizer's own when built), and for a step every layer's output
    kept for the backward pass plus its gradient, and the weights' gradients."""
    def nbytes(v) -> int:
        return int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize

    weights = sum(nbytes(v) for v in model.variables)
    slots = sum(nbytes(v) for v in getattr(model.optimizer, "variables", []) or [])
    persistent = weights + (slots if slots else 2 * weights)
    activations = 0
    for layer in model.layers:
        for out in tf.nest.flatten(getattr(layer, "output", None)):
            shape = getattr(out, "shape", None)
            if shape is not None and all(d is not None for d in shape[1:]):
                activations += int(np.prod(shape[1:])) * batch_size * 4
    return persistent, 2 * activations + weights
