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
- the step runs without XLA (the planner rewrites TensorFlow graph ops): a model compiled with
  ``jit_compile=True`` (as Keras leaves it where a device supports XLA) computes the same function
  with other rounding, and a ``UserWarning`` says so when the job is made;
- ``verbose`` reaches the callbacks' ``params`` as fit's does, but the run's progress lines take
  the place of Keras' progress bar; ``validation_freq`` and ``validation_steps`` are fit's;
- the loss the host records per step is fit's batch log ``loss``: the running mean since the
  epoch began.

Note [fit's batches]
A Keras job's batches are ``model.fit``'s (issue 58 item 3): ``keras_fit`` makes fit's own epoch
iterator (Keras' ``TFEpochIterator`` over its data adapters, with fit's ``batch_size``,
``steps_per_epoch``, ``shuffle``, ``class_weight`` and ``sample_weight``; ``validation_split``
by Keras' ``train_validation_split``), and ``FitBatches`` runs fit's loop over it: ``reset``
once, then each epoch's batches, a new pass over the data where fit starts one. So x is
anything fit takes (arrays, dicts or lists of them, a ``tf.data.Dataset``, a generator, a
``keras.utils.PyDataset``), every epoch has fit's ``num_batches`` steps, the last partial batch
among them, and the callbacks' ``params`` and batch numbers are fit's. Each batch is handed to
the host flat (``tf.nest.flatten``: a job's step takes a tuple of tensors, which the capture,
the plans and the node groups read) and packed back to fit's ``(x, y, sample_weight)``
structure inside the step. The step is traced once, with the TensorSpecs of fit's dataset
(``TrainStep.input_specs``): where the data has a partial batch, fit's dataset leaves the batch
dimension free, and so does the job's trace, so the partial batch runs through the very step
the others run (no trace of its own) and every batch computes in fit's graph shapes. Its bytes
are the step's: the probe measured a whole batch, the planner (which sizes dynamic shapes from
one measured step, tensile_tf/tf/capture.py) planned for one, and a partial batch takes fewer
(its record's peak, checked in tests/tf/test_keras_inputs.py).

Note [The last epoch ended]
fit ends every epoch through its epoch iterator, the last one included: the data adapter's
``on_epoch_end`` stops a ``PyDataset``'s workers (Keras' enqueuer) and calls the dataset's own
``on_epoch_end``. A job stops taking batches at its last step, inside its last epoch, so that
call never came: the dataset's ``on_epoch_end`` ran once less than under fit, and the enqueuer's
worker threads outlived the job (three jobs of a ``PyDataset(workers=2)`` left 18 threads
running in the process, and as many again each time). So the epoch the job ends in is ended as
fit ends its last: when the fit loop ends (its last step, or a callback's ``stop_training``),
and where the job ends otherwise (a failure, a pruned trial), when its batches are closed or
collected (``FitBatches.close``; the generator's ``finally``). Measured after: no thread left.

What decides the order: fit's shuffling of arrays is ``tf.random.shuffle`` inside the dataset
Keras builds, seeded from TensorFlow's global seed when that dataset is made (at ``fit``'s call,
and here at ``from_keras``'s); a ``tf.data.Dataset``'s own ``shuffle`` likewise. So a job made
right after ``keras.utils.set_random_seed(s)`` draws fit's order after the same call, whatever
runs in between (measured: other random ops between the seed and the data change nothing), and
``seed=s`` is that call made right before the data (it sets Keras' global seeds, as the call
does). With a global seed Keras draws the same permutation each epoch (fit's, reproduced). Not
bit for bit, and why: without a global seed fit's order is random, and so is the job's; a
``PyDataset`` with ``shuffle=True`` shuffles with Python's global ``random`` as each epoch
begins (Keras' own), which jobs running at once (and anything else) draw from in between;
sparse or ragged inputs and ``steps_per_execution`` above 1 are refused, as is data of unknown
length without ``steps_per_epoch`` (a job's step count is fixed when it is made), and data that
runs out before an epoch's end fails the job with what to do (fit ends that epoch early).
Measured before (issue 58): a shuffled ``tf.data.Dataset`` trained 3.4e-2 off fit's weights after
3 epochs, because the old job read it through ``.repeat()``, whose later epochs shuffle in
another order than fit's new pass over the dataset each epoch.

Note [Variables made before the trace]
A tf.function whose first trace creates variables is traced twice: once creating them (under
TensorFlow's variable-lifting scope, each variable an initializer graph of its own) and once more
creating none (``Function._get_concrete_function_garbage_collected``). A compiled model's optimizer
slots and compile metrics are made lazily, by the first step, so the job's one trace of fit's
step was two (fit traces its step inside an outer function and pays the second trace cheaply).
So a Keras job makes them when it is built, in the job's pool stream, as Keras' own
``Trainer._symbolic_build`` does (the model, compile metrics and loss built on fit's input specs,
then ``optimizer.build(trainable_variables)``): the zeros fit's first step makes, and one trace.
Measured (keras_tuner_bench.py's digits random search, 16 trials, 1 at a time, py-spy): the second
trace took 3.5 s of 40 s. A YAML job's optimizer too, and a keras_file job's compile metrics
(build_train_step): a trace of the CNN's step 0.3-0.5 -> 0.1 s, the io-mem MLP's 1.1-1.5 -> 0.3-0.5 s.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import tensorflow as tf

from tensile_tf.jobs.datasets import iterated_as_tf_data_would


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
    validation: tuple | None = None     # fit's (val_x, val_y, val_sample_weight): x anything fit takes
    validation_batch_size: int | None = None
    initial_epoch: int = 0              # fit's initial_epoch: epochs initial_epoch .. epochs - 1 run
    steps: int | None = None            # a step count instead of whole epochs (the last one partial)
    validation_freq: int | list = 1     # fit's: validate every this many epochs, or at the epochs listed
    validation_steps: int | None = None  # fit's: batches of validation data each time (None: all)
    batches: Any = None                 # the job's FitBatches, ended with the loop (Note [The last epoch ended])
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
                self.model._eval_epoch_iterator = None   # fit's validation iterator, made at its first validation
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
                if self.validation is not None and self._should_validate(epoch):
                    epoch_logs.update(self._validate())
                self.callbacks.on_epoch_end(epoch, epoch_logs)
                self.logs = epoch_logs
            if last or self.model.stop_training:
                if self.batches is not None:   # Note [The last epoch ended]
                    self.batches.close()
                self.model.optimizer.finalize_variable_values(self.model.trainable_weights)
                # fit drops its validation iterator after the last epoch, before on_train_end
                if getattr(self.model, "_eval_epoch_iterator", None) is not None:
                    del self.model._eval_epoch_iterator
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

    def _should_validate(self, epoch: int) -> bool:
        """fit's ``_should_eval``: every ``validation_freq`` epochs, or the (1-based) epochs it lists."""
        freq = self.validation_freq
        return (epoch + 1) % freq == 0 if isinstance(freq, int) else epoch + 1 in freq

    def _validate(self, steps: int | None = None, callbacks: Any = "fit's") -> dict[str, float]:
        x, y, sample_weight = self.validation
        cached = steps is None   # fit's validation (not the probe's one batch): fit's iterator, made once
        steps = steps or self.validation_steps
        callbacks = self.callbacks if callbacks == "fit's" else callbacks
        if cached:
            from keras.src.backend.tensorflow.trainer import TFEpochIterator

            if getattr(self.model, "_eval_epoch_iterator", None) is None:   # as fit makes it, kept for later epochs
                self.model._eval_epoch_iterator = iterated_as_under_fit(TFEpochIterator(
                    x=x, y=y, sample_weight=sample_weight, batch_size=self.validation_batch_size,
                    distribute_strategy=self.model.distribute_strategy,
                    steps_per_execution=self.model.steps_per_execution, steps_per_epoch=steps, shuffle=False))
        logs = self.model.evaluate(x=x, y=y, sample_weight=sample_weight, batch_size=self.validation_batch_size,
                                   steps=steps, verbose=0, return_dict=True, callbacks=callbacks,
                                   **({"_use_cached_eval_dataset": True} if cached else {}))
        return {f"val_{k}": float(val) for k, val in logs.items()}


class FitBatches:
    """fit's batches (Note [fit's batches]): ``model.fit``'s own epoch iterator over Keras' data
    adapters, epoch after epoch, each batch flattened to a tuple of tensors for the host's step;
    ``specs`` the flat TensorSpecs of fit's dataset, which the host traces the step with."""

    def __init__(self, name: str, epoch_iterator: Any, epochs: int | None):
        self.name, self.epoch_iterator, self.epochs = name, epoch_iterator, epochs
        self.steps_per_epoch = epoch_iterator.num_batches
        self.structure = epoch_iterator._get_iterator().element_spec   # what fit's train_function reads
        leaves = tf.nest.flatten(self.structure)
        odd = sorted({type(s).__name__ for s in leaves if not isinstance(s, tf.TensorSpec)})
        if odd:
            raise KerasJobError(f"job {name!r}: inputs of {', '.join(odd)} cannot be a job's step arguments; "
                                "give dense arrays or tensors (e.g. tf.sparse.to_dense, ragged.to_tensor())")
        self.specs = tuple(leaves)
        dims = {s.shape[0] for s in leaves if s.shape.rank}
        self.batch_size = epoch_iterator.data_adapter.batch_size or (dims.pop() if len(dims) == 1 else None)
        self._batches = self._fit_order()

    def _fit_order(self):
        """fit's loop over its epoch iterator: ``reset`` once, then each epoch's batches; the epoch
        the job ends in ended as fit ends its last (Note [The last epoch ended])."""
        it, epoch, epoch_open = self.epoch_iterator, 0, False
        it.reset()
        try:
            while self.epochs is None or epoch < self.epochs:
                seen = 0
                epoch_open = True
                with it.catch_stop_iteration():
                    for _, _, iterator in it:
                        data = next(iterator)
                        seen += 1
                        yield tuple(tf.nest.flatten(data))
                epoch_open = False   # the loop's end ran the adapter's on_epoch_end
                if seen < self.steps_per_epoch:
                    raise KerasJobError(f"job {self.name!r}: the data ran out after {seen} of epoch {epoch}'s "
                                        f"{self.steps_per_epoch} batches (fit would end the epoch there); make it "
                                        "last (a tf.data dataset's .repeat()) or lower steps_per_epoch")
                epoch += 1
        finally:
            if epoch_open:
                it.data_adapter.on_epoch_end()

    def __call__(self) -> tuple:
        return next(self._batches)

    def close(self) -> None:
        """Note [The last epoch ended]: the job took its last batch (or ends early)."""
        self._batches.close()

    def pack(self, flat: Sequence) -> Any:
        """A flat batch as fit's step gets it: ``(x, y[, sample_weight])`` with x as given (a dict, ...)."""
        return tf.nest.pack_sequence_as(self.structure, list(flat))

    def model_inputs(self, flat: Sequence) -> Any:
        from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

        return unpack_x_y_sample_weight(self.pack(flat))[0]


def _check_compiled(name: str, model: Any) -> None:
    import keras

    if not isinstance(model, keras.Model):
        raise KerasJobError(f"job {name!r}: from_keras takes a keras.Model, got {type(model).__name__}")
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise KerasJobError(f"job {name!r}: the model is not compiled; call model.compile(optimizer=..., "
                            "loss=..., metrics=[...]) first (from_keras trains with the compiled settings)")
    if getattr(model, "steps_per_execution", 1) != 1:
        raise KerasJobError(f"job {name!r}: the model was compiled with steps_per_execution="
                            f"{model.steps_per_execution}; a job's step is one batch, so compile it with "
                            "steps_per_execution=1 (the default)")


def _check_fit_values(name: str, verbose, validation_freq, validation_steps, steps, initial_epoch, epochs) -> None:
    if verbose not in ("auto", 0, 1, 2):
        raise KerasJobError(f"job {name!r}: verbose must be 'auto', 0, 1 or 2 (fit's), got {verbose!r}")
    if not (isinstance(validation_freq, int) and validation_freq >= 1 or isinstance(validation_freq, list)):
        raise KerasJobError(f"job {name!r}: validation_freq must be a whole number of epochs >= 1 or a list of "
                            f"epochs (fit's), got {validation_freq!r}")
    if validation_steps is not None and validation_steps < 1:
        raise KerasJobError(f"job {name!r}: validation_steps must be at least 1, got {validation_steps}")
    if steps is not None:   # a step count instead of epochs: as many epochs as it takes
        if steps < 1:
            raise KerasJobError(f"job {name!r}: steps must be at least 1, got {steps}")
        if initial_epoch:
            raise KerasJobError(f"job {name!r}: give steps or initial_epoch, not both")
    if not 0 <= initial_epoch < epochs:
        raise KerasJobError(f"job {name!r}: fit runs epochs initial_epoch .. epochs - 1, so epochs must be "
                            f"above initial_epoch >= 0 (got epochs={epochs}, initial_epoch={initial_epoch})")


def keras_fit(name: str, model: Any, x: Any = None, y: Any = None, *, dataset: Any = None,
               batch_size: int | None = None, epochs: int = 1, initial_epoch: int = 0,
               steps_per_epoch: int | None = None, steps: int | None = None,
               validation_data: Any = None, validation_split: float = 0.0,
               validation_batch_size: int | None = None, callbacks: Sequence[Any] = (),
               shuffle: bool | str = True, seed: int | None = None, class_weight: dict[int, float] | None = None,
               sample_weight: Any = None, verbose: int | str = "auto",
               validation_steps: int | None = None, validation_freq: int | list = 1) -> tuple[FitLoop, Callable, Any]:
    """fit's loop for a compiled ``keras.Model`` (Note [fit's loop in a job]; the arguments are
    fit's, with fit's defaults): the FitLoop hooks, the step function and the batches, which
    ``Job.from_keras`` makes a job of. ``x`` is anything fit takes (arrays, dicts or lists of
    them, a ``tf.data.Dataset``, a generator, a ``keras.utils.PyDataset``), iterated by fit's
    own data adapters (Note [fit's batches]); ``dataset=`` is the older name for a dataset as
    ``x``. Not fit's: ``steps`` trains that many steps instead of whole epochs (the last epoch
    ends, with its logs and callbacks, at the last step); ``seed`` calls
    ``keras.utils.set_random_seed(seed)`` right before the data is made, which decides
    ``shuffle``'s order as it does fit's. ``verbose`` reaches the callbacks' ``params``; the
    run's own progress lines take the place of Keras' progress bar."""
    import keras
    from keras.src.backend.tensorflow.trainer import TFEpochIterator
    from keras.src.trainers.data_adapters import array_slicing, data_adapter_utils

    _check_compiled(name, model)
    _check_fit_values(name, verbose, validation_freq, validation_steps, steps, initial_epoch, epochs)
    if getattr(model, "jit_compile", False) is True:   # said once, at submit (Note [fit's loop in a job])
        warnings.warn(f"job {name!r}: the model was compiled with jit_compile=True; the job's step runs without "
                      "XLA (the planner rewrites TensorFlow's graph ops), the same function with other rounding",
                      UserWarning, stacklevel=3)
    if dataset is not None:   # the older form of a dataset as x
        if x is not None or y is not None:
            raise KerasJobError(f"job {name!r}: give the data as x (and y), or as dataset=, not both")
        x = dataset
    if x is None:
        raise KerasJobError(f"job {name!r}: give the training data as x (and y), as model.fit takes it")
    epochs = min(epochs, keras.config.max_epochs() or epochs)   # fit's debugging cap
    try:
        if validation_split and validation_data is None:   # fit's: the last fraction, before any shuffling
            (x, y, sample_weight), validation_data = array_slicing.train_validation_split(
                (x, y, sample_weight), validation_split=validation_split)
        if seed is not None:
            keras.utils.set_random_seed(seed)
        epoch_iterator = iterated_as_under_fit(TFEpochIterator(
            x=x, y=y, sample_weight=sample_weight, batch_size=batch_size, steps_per_epoch=steps_per_epoch,
            shuffle=shuffle, class_weight=class_weight, distribute_strategy=model.distribute_strategy,
            steps_per_execution=1))
    except ValueError as e:   # what fit itself refuses, in Keras' words
        raise KerasJobError(f"job {name!r}: {e}") from None
    if not epoch_iterator.num_batches:
        raise KerasJobError(f"job {name!r}: the data's length is unknown (a generator, or a dataset of unknown "
                            "cardinality): give steps_per_epoch, as a job's step count is fixed when it is made")
    steps_per_epoch = epoch_iterator.num_batches
    if steps is not None:
        epochs = -(-steps // steps_per_epoch)
    batches = FitBatches(name, epoch_iterator, epochs - initial_epoch)
    if validation_data is not None:
        validation_data = data_adapter_utils.unpack_x_y_sample_weight(validation_data)
    callback_list = keras.callbacks.CallbackList(list(callbacks), add_history=True, add_progbar=False,
                                                 verbose=verbose, epochs=epochs, steps=steps_per_epoch, model=model)
    fit = FitLoop(model, steps_per_epoch, epochs, callback_list, validation_data,
                   validation_batch_size or batch_size, initial_epoch, steps, validation_freq, validation_steps,
                   batches)
    return fit, keras_train_step(model, batches.pack), batches


def iterated_as_under_fit(epoch_iterator: Any) -> Any:
    """Keras' epoch iterator, its dataset iterated with tf.data's autotuning off and the prefetch
    tf.data would add (Notes [No autotuning thread per job], [The prefetch tf.data would add])."""
    epoch_iterator._distributed_dataset = iterated_as_tf_data_would(epoch_iterator._distributed_dataset)
    return epoch_iterator


def made_before_the_trace(model: Any, batches: "FitBatches") -> list:
    """Note [Variables made before the trace]: the model's, its compile metrics' and its
    optimizer's variables made now, as Keras' ``_symbolic_build`` makes them, on fit's input
    specs; returns the variables a job's TrainStep holds (the model's and the metrics')."""
    model._symbolic_build(data_batch=batches.pack(batches.specs))
    return [*model.variables, *model.metrics_variables]


def keras_train_step(model: Any, pack: Callable[[Sequence], Any] | None = None) -> Callable:
    """The compiled model's own step (fit's): loss, gradients, optimizer, metrics; returns fit's
    batch log ``loss``. ``pack``: the flat batch the host passes, as fit's step gets it."""
    def step(*batch):
        return model.train_step(pack(batch) if pack is not None else batch)["loss"]

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
