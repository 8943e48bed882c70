"""What a job runs: a ``TrainStep`` (a train-step function, its batches, its
variables), and how one is built from a YAML ``JobSpec``.

A ``Job`` is what the host schedules: a name, a step count and a way to get a
``TrainStep``: either a builder the host may call again (YAML jobs, which the
host can tear down and rebuild when it must queue them) or a ready TrainStep
handed over from Python (which the host keeps as it is).
"""
from __future__ import annotations

import importlib
import inspect
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import tensorflow as tf

from tensile_tf.config.schema import EXAMPLE_KINDS, JobSpec
from tensile_tf.jobs.datasets import iterated_without_autotuning


class JobBuildError(RuntimeError):
    """A job's model, data or train step could not be built."""


class JobDoesNotFit(JobBuildError):
    """A job's data can never fit (the machine's memory): the job is
    rejected, with the numbers and the YAML key to change."""


@dataclass
class TrainStep:
    """One job's training step and its inputs.

    ``step_fn(*batch)`` runs one step and returns the loss (a scalar tensor);
    plain Python or a ``tf.function``: the host wraps it in its own
    ``tf.function`` attributed to the job. ``batches`` is an iterable of
    tuples (re-iterated when exhausted) or a zero-argument callable returning
    the next tuple. ``input_specs``: TensorSpecs the host traces the step with instead of the
    first batch's shapes (a Keras job's are fit's: dimension 0 free where fit's data has a
    partial batch, Note [fit's batches] in keras_fit.py), so one trace takes every batch.
    ``inputs_of(batch)``: the model's inputs in a batch, where they are not ``batch[0]``.
    """

    step_fn: Callable[..., Any]
    batches: Iterable[tuple] | Callable[[], tuple]
    variables: Sequence[tf.Variable] = ()
    model: Any = None
    optimizer: Any = None
    validator: Any = None       # datasets.Validator, when the job holds out validation examples
    input_specs: tuple | None = None
    inputs_of: Callable[[tuple], Any] | None = None
    _iterator: Any = field(default=None, repr=False)
    _peeked: list = field(default_factory=list, repr=False)

    def peek_batch(self) -> tuple:
        """The batch ``next_batch`` returns next, taken now (a prediction traces with it)."""
        if not self._peeked:
            self._peeked.append(self.next_batch())
        return self._peeked[0]

    def next_batch(self) -> tuple:
        if self._peeked:
            return self._peeked.pop()
        if callable(self.batches) and not isinstance(self.batches, tf.data.Dataset):
            batch = self.batches()
        else:
            if self._iterator is None:
                self._iterator = iter(iterated_without_autotuning(self.batches))
            try:
                batch = next(self._iterator)
            except StopIteration:
                self._iterator = iter(iterated_without_autotuning(self.batches))
                batch = next(self._iterator)
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)


@dataclass
class Job:
    """A training job for the JobHost.

    ``build()`` returns the job's TrainStep; ``rebuildable`` says whether the
    host may call it again after tearing the job down (to queue it).
    """

    name: str
    build: Callable[[], TrainStep]
    steps: int
    stop_on_nan: bool = True
    rebuildable: bool = True
    spec: JobSpec | None = None
    # Called in the job's thread after every step; returning False stops the
    # job early with status "stopped" (search drivers prune trials with it).
    on_step: Callable[[Any], bool] | None = None
    # Called in the host's main thread once the job has ended and released
    # its memory.
    on_end: Callable[[Any], None] | None = None
    # Runs around every step, the first (probe) step's included: ``before(state, on_device)``
    # and ``after(state, on_device)``, ``on_device()`` a context in which the variables a
    # plan keeps on the host are back (Note [fit's loop in a job] in keras_fit.py).
    step_hooks: Any = None
    # (persistent, temporary) bytes predicted before the job is measured, for a job without a
    # YAML spec (admission probes an unmeasured job beside running ones only if it fits).
    estimate_needs: Callable[[], tuple[int, int]] | None = None

    @property
    def history(self):
        """The ``keras.callbacks.History`` of a job made by ``from_keras`` (else None)."""
        return self.step_hooks.history if self.step_hooks is not None and hasattr(self.step_hooks, "history") \
            else None

    @classmethod
    def from_train_step(cls, name: str, train_step: TrainStep, *, steps: int,
                        stop_on_nan: bool = True) -> "Job":
        """A job from a user's own TrainStep (built already; never rebuilt).

        The job holds the TrainStep until it ends, then lets go of it
        (``forget``), so its variables can leave the pool unless the caller
        still holds them.
        """
        holder = [train_step]

        def handed_over() -> TrainStep:
            if not holder:
                raise RuntimeError(f"job {name!r} has ended; its TrainStep was released")
            return holder[0]

        job = cls(name=name, build=handed_over, steps=steps, stop_on_nan=stop_on_nan, rebuildable=False)
        job._holder = holder  # type: ignore[attr-defined]
        job.estimate_needs = _traced_graph_estimate(name, holder)
        return job

    @classmethod
    def from_keras(cls, name: str, model: Any, x: Any = None, y: Any = None, *, stop_on_nan: bool = True,
                   **fit_args: Any) -> "Job":
        """A job training a compiled ``keras.Model`` as ``model.fit(x, y, **fit_args)`` would,
        callbacks included; ``job.history`` is fit's History (Note [fit's loop in a job] in
        tensile_tf/jobs/keras_fit.py)."""
        from tensile_tf.jobs.keras_fit import estimated_needs, keras_fit, made_before_the_trace

        fit, step, batches = keras_fit(name, model, x, y, **fit_args)
        train = TrainStep(step_fn=step, batches=batches, variables=[*model.variables, *model.metrics_variables],
                          model=model, optimizer=model.optimizer, input_specs=batches.specs,
                          inputs_of=batches.model_inputs)
        job = cls.from_train_step(name, train, steps=fit.total_steps, stop_on_nan=stop_on_nan)
        handed_over = job.build

        def build() -> TrainStep:   # in the job's pool stream (Note [Variables made before the trace])
            built = handed_over()
            built.variables = made_before_the_trace(model, batches)
            return built

        job.build = build
        job.on_step, job.step_hooks = fit.keep_going, fit
        job.estimate_needs = lambda: estimated_needs(model, batches.batch_size or 32)
        return job

    def forget(self) -> None:
        """Drops a handed-over TrainStep once the job has ended."""
        holder = getattr(self, "_holder", None)
        if holder:
            holder.clear()

    def as_ended(self) -> "Job":
        """The job as the host's record of it keeps it once it has ended: its name, length, spec and
        ``on_end``, none of the closures and hooks that reach its model (``build``, ``step_hooks``,
        ``estimate_needs``, ``on_step``). The host keeps every job's record for the run's result,
        and a packed search's run lasts the search: with the Job itself, every trial's model (and
        its weights, in the pool) lived until the search ended (Note [A trial's model given back]
        in tensile_tf/search/packed_tuner.py). The caller's own Job keeps them (``job.history``)."""
        name = self.name   # not self: the closure would keep the job, and its model, alive

        def ended() -> TrainStep:
            raise RuntimeError(f"job {name!r} has ended; its TrainStep was released")

        return replace(self, build=ended, step_hooks=None, estimate_needs=None, on_step=None)

    @classmethod
    def from_spec(cls, spec: JobSpec) -> "Job":
        return cls(name=spec.name, build=lambda: build_train_step(spec), steps=spec.total_steps,
                   stop_on_nan=spec.stop_on_nan, rebuildable=True, spec=spec)


# ------------------------------------------------------------ from a JobSpec

def import_reference(ref: str, *, what: str) -> Callable:
    """'package.module:function' -> the function; JobBuildError says what failed."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise JobBuildError(f"{what} {ref!r}: cannot import module {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise JobBuildError(f"{what} {ref!r}: module {module_name!r} has no function {attr!r}")
    return fn


def _call_with_known_args(fn: Callable, args: dict, **offered: Any) -> Any:
    """Calls fn(**args), adding each `offered` keyword that fn accepts and args lacks."""
    params = inspect.signature(fn).parameters
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
    kwargs = dict(args)
    for key, value in offered.items():
        if key not in kwargs and value is not None and (key in params or takes_kwargs):
            kwargs[key] = value
    return fn(**kwargs)


def _make_optimizer(spec: JobSpec):
    import keras

    try:
        return keras.optimizers.get({"class_name": spec.optimizer.name,
                                     "config": {"learning_rate": spec.optimizer.learning_rate,
                                                **spec.optimizer.args}})
    except (ValueError, TypeError) as e:
        raise JobBuildError(f"job {spec.name!r}: optimizer {spec.optimizer.name!r}: {e}") from None


def _make_loss(spec: JobSpec):
    import keras

    try:
        return keras.losses.get(spec.loss)
    except (ValueError, TypeError) as e:
        raise JobBuildError(f"job {spec.name!r}: loss {spec.loss!r}: {e}") from None


class HostBatches:
    """A job's input batches held in host memory, copied into the pool one at
    a time, as a GPU job keeps its data on the host and copies each batch to
    the device.

    Note [Input data on the host]. A YAML job's synthetic data used to be
    ``data.num_batches`` (default 4) batches in the pool for the job's whole
    life: the planner counted them (Note [Data held beside the step] in
    tensile_tf/tf/step_memory.py) but no plan could move them, and four jobs held
    sixteen. Now the arrays stay in host memory and each call returns the next
    batch as tensors made on the calling thread (the job's stream): the pool
    holds the batch a step reads (``DataSpec.device_batches``), and with
    ``data.prefetch`` the one after it too, whatever ``data.num_batches`` says.
    The values and their order are the same either way, so training computes
    the same thing.

    Note [Just-in-time batches]. The next batch is copied when the step asks
    for it, not before, as TENSILE starts a Swap-In Event as late as it can
    and still arrive in time (seed 000, section IV-C): here the copy is a
    memcpy of well under a millisecond on the job's own thread, so "in time"
    is "right before the step". A prefetched batch (the twelfth session's default) hid
    nothing: it was copied on the same thread between the same two steps, one
    step earlier, and then sat in the pool a whole step. In the node-group
    pipeline it sat there when it hurt most: Algorithm 1 pairs a job's last
    DNGs with the next job's ANGs, so a job's step boundary, where it holds
    both batches, meets the other jobs' peaks. Four small CNN jobs in 120 MiB
    (benchmarks/RESULTS.md, Issue 20, thirteenth session): 55 with the
    prefetch against 65 alone, 61 without against 68. ``data.prefetch: true``
    keeps the next batch in the pool for a user whose batches are worth
    holding early.
    """

    def __init__(self, host: Sequence[tuple[np.ndarray, ...]], device_batches: int = 1):
        if not host:
            raise ValueError("HostBatches needs at least one batch")
        self.host = list(host)
        self.device_batches = max(1, device_batches)
        self._next = 0
        self._ready: list[tuple] = []

    def __call__(self) -> tuple:
        while len(self._ready) < self.device_batches:
            arrays = self.host[self._next % len(self.host)]
            self._next += 1
            # DeepCopy: a tensor made from a page-aligned numpy array may share its memory instead
            # of being copied into the pool; a device batch is a copy, as a GPU job's is
            self._ready.append(tuple(tf.raw_ops.DeepCopy(x=tf.constant(a)) for a in arrays))
        return self._ready.pop(0)


def synthetic_batches(spec: JobSpec, input_shape: Sequence[int], classes: int) -> HostBatches:
    """spec.data.num_batches fixed random (x, y) batches, reproducible from the
    seed, held on the host (Note [Input data on the host]).

    Each batch is made in host memory; before each, the machine's free memory
    is checked, so a batch larger than the machine rejects the job instead of
    the kernel killing the process (tensile_tf.config.validation.host_batch_problem)."""
    from tensile_tf.config.validation import host_batch_problem

    rng = np.random.default_rng(spec.seed)
    out = []
    for _ in range(spec.data.num_batches):
        problem = host_batch_problem(spec, tuple(input_shape))
        if problem is not None:
            raise JobDoesNotFit(f"job {spec.name!r}: `batch_size:` {problem.message()}")
        x = rng.standard_normal((spec.batch_size, *input_shape), dtype=np.float32)
        y = rng.integers(0, classes, spec.batch_size).astype(np.int32)
        out.append((x, y))
    return HostBatches(out, device_batches=spec.data.device_batches)


def supervised_train_step(model, optimizer, loss_fn) -> Callable:
    """The standard step: forward, loss, gradients, optimizer update."""

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def batch_size_key(spec: JobSpec) -> tuple[str, int] | None:
    """The key that sets this job's batch size and its value, for advice (an out-of-memory's
    remedy): ``batch_size`` where the job's batches follow it, ``model.args.batch_size`` where a
    train_step_factory gets it there; None for a factory that keeps its own default."""
    if not spec.model.train_step_factory:
        return "batch_size", spec.batch_size
    if "batch_size" in spec.model.args:
        return "model.args.batch_size", spec.model.args["batch_size"]
    if "batch_size" in spec.model_fields_set:
        return "batch_size", spec.batch_size
    return None


def build_train_step(spec: JobSpec) -> TrainStep:
    """Builds model, optimizer, loss and data for a YAML job."""
    import keras

    keras.utils.set_random_seed(spec.seed)
    model_spec = spec.model
    if model_spec.train_step_factory:
        factory = import_reference(model_spec.train_step_factory, what="train_step_factory")
        # a factory's own batch_size default stands unless the job sets one (issue 57)
        made = _call_with_known_args(factory, model_spec.args, input_shape=spec.input_shape,
                                     classes=spec.classes, seed=spec.seed,
                                     batch_size=spec.batch_size if "batch_size" in spec.model_fields_set else None)
        if not isinstance(made, TrainStep):
            raise JobBuildError(f"job {spec.name!r}: train_step_factory {model_spec.train_step_factory!r} "
                                f"returned {type(made).__name__}, expected tensile_tf.TrainStep")
        return made

    parts: dict[str, Any] = {}
    if model_spec.keras_file:   # compiled: its optimizer, loss and metrics, and fit's step
        from tensile_tf.jobs.keras_fit import saved_keras_model

        model = saved_keras_model(spec.name, model_spec.keras_file)
        parts.update(model=model, optimizer=model.optimizer,
                     loss=lambda y, pred: model.compute_loss(y=y, y_pred=pred, training=False))
    elif model_spec.application:
        app = getattr(keras.applications, model_spec.application, None)
        if app is None:
            raise JobBuildError(f"job {spec.name!r}: keras.applications has no model "
                                f"{model_spec.application!r}")
        kwargs = {"weights": None, "input_shape": tuple(spec.input_shape), "classes": spec.classes,
                  **model_spec.args}
        try:
            parts["model"] = app(**kwargs)
        except (ValueError, TypeError) as e:
            raise JobBuildError(f"job {spec.name!r}: {model_spec.application}({kwargs}): {e}") from None
    else:
        builder = import_reference(model_spec.builder, what="builder")
        made = _call_with_known_args(builder, model_spec.args,
                                     input_shape=tuple(spec.input_shape) if spec.input_shape else None,
                                     classes=spec.classes)
        if isinstance(made, dict):
            unknown = set(made) - {"model", "optimizer", "loss", "dataset"}
            if unknown or "model" not in made:
                raise JobBuildError(f"job {spec.name!r}: builder {model_spec.builder!r} must return a "
                                    "keras.Model or a dict with 'model' and optionally 'optimizer', "
                                    f"'loss', 'dataset' (got keys {sorted(made)})")
            parts.update(made)
        else:
            parts["model"] = made
    model = parts["model"]
    optimizer = parts.get("optimizer") or _make_optimizer(spec)
    loss_fn = parts.get("loss") or _make_loss(spec)
    if model.built:   # its slots made now, not by the step's first trace (Note [Variables made before the trace])
        optimizer.build(model.trainable_variables)

    validator = None
    if "dataset" in parts:
        batches = parts["dataset"]
    elif spec.data.kind in EXAMPLE_KINDS:
        from tensile_tf.jobs import datasets

        x, y = datasets.load_examples(spec)
        xt, yt, xv, yv = datasets.split_examples(x, y, spec.data.validation_split, spec.seed, spec.name,
                                                 spec.batch_size)
        if spec.data.validation_path:
            xv, yv = datasets.load_validation_examples(spec)
        batches = datasets.training_batches(xt, yt, spec.batch_size, spec.seed)
        if len(xv):
            validator = datasets.Validator(model, loss_fn, xv, yv, spec.batch_size, spec.metrics, spec.validate_every)
    elif spec.data.kind == "function":
        fn = import_reference(spec.data.function, what="data function")
        batches = _call_with_known_args(fn, spec.data.args, batch_size=spec.batch_size, seed=spec.seed)
    else:
        input_shape = spec.input_shape or tuple(model.input_shape[1:])
        batches = synthetic_batches(spec, input_shape, spec.classes)
    if isinstance(batches, tf.data.Dataset):
        batches = batches.repeat()
    if model_spec.keras_file:
        from tensile_tf.jobs.keras_fit import keras_train_step

        if model.built and (specs := _batch_specs(batches)) is not None:   # Note [Variables made before the trace]
            model._symbolic_build(data_batch=specs)  # noqa: SLF001 - its compile metrics too (tf_internals.py)
        return TrainStep(step_fn=keras_train_step(model), batches=batches, variables=[
            *model.variables, *model.metrics_variables], model=model, optimizer=optimizer, validator=validator)
    return TrainStep(step_fn=supervised_train_step(model, optimizer, loss_fn), batches=batches,
                     variables=model.variables, model=model, optimizer=optimizer, validator=validator)


def _batch_specs(batches: Any) -> tuple | None:
    """The TensorSpecs of a YAML job's batches, read without taking one (None: not known)."""
    if isinstance(batches, HostBatches):
        return tuple(tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in batches.host[0])
    return tuple(tf.nest.flatten(batches.element_spec)) if isinstance(batches, tf.data.Dataset) else None


def cycle(items: Sequence[tuple]) -> Callable[[], tuple]:
    """A batches callable that cycles through a fixed list."""
    it = itertools.cycle(items)
    return lambda: next(it)


def _traced_graph_estimate(name: str, holder: list) -> Callable[[], tuple[int, int] | None]:
    """A handed-over TrainStep's (persistent, temporary) bytes, predicted once from its traced
    graph (``graph_needs``; issue 58): admission probes it beside running jobs only where that
    prediction fits, as a YAML job's prediction from a measured one of its kind, or a Keras job's
    from its model's shapes. The batch it traces with is the job's first (``peek_batch``)."""
    cached: list = []

    def estimate() -> tuple[int, int] | None:
        if not cached and holder:
            from tensile_tf.tf.unplanned_peaks import graph_needs

            train = holder[0]
            try:
                batch = train.peek_batch()
            except Exception:  # noqa: BLE001 - the job's build takes its batch again and fails with the error
                return None
            cached.append(graph_needs(name, train.step_fn, batch, train.optimizer))
        return cached[0] if cached else None

    return estimate
