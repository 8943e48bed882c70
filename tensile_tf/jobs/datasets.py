"""A YAML job's examples from the user's files or a bundled dataset, and its
validation (``data.kind`` npz, npy, tfrecord, image_dir, digits;
``data.validation_split``; ``metrics``, ``validate_every``).

Examples are read once into host memory, split with the job's seed (the
validation share is the same examples in every run of the config), and fed
through ``tf.data``: shuffled with the seed each epoch, in batches of
``batch_size`` (a last partial batch is dropped, so every step has the same
shapes and one traced step). Only the batch a step uses enters the pool.

``Validator`` evaluates the job's model on the validation examples in the
job's own thread between two steps (its memory is the job's): the loss and
each named Keras metric, with ``training=False`` (dropout off, batch norm on
its moving statistics), so validating never changes what training computes.

Note [No autotuning thread per job]
A ``tf.data`` iterator with autotuning on (tf.data's default) starts a thread,
``model::Model::OptimizeLoop``, that sleeps between optimizations for a period
that doubles up to 60 s; the iterator's destructor cancels it and waits for it.
A job's iterator is often garbage in a reference cycle (Keras' epoch iterator,
the generator over it), so it is destroyed inside a ``gc.collect()``: the
teardown's, or ``JobHost.run``'s at its start, on the run loop's thread, with
the GIL held. Measured (issue 57): py-spy and gdb 2.5 s into such collections
showed the collecting thread in ``~RootDataset::Iterator`` waiting on the
iterator's thread, itself asleep in ``OptimizeLoop``'s condition variable: one
collection took 170 s, one test worker spent 151 s of wall time in collections
that used 21.6 s of CPU, and every other job's thread waited on the GIL the
while. The wake-up is lost in a race: ``CancellationManager::StartCancel``
runs the callbacks (the one ``OptimizeLoop`` registered wakes the thread)
before it marks the manager cancelled, so a thread that wakes first finds it
not yet cancelled and sleeps out the rest of its period. Measured with
``benchmarks/iterator_teardown_bench.py --trials 20 --live-s 1.5``: 6 of 20
deletions waited (up to 1,047 ms) with autotuning on, 0 of 20 (at most
0.5 ms) with it off. So every dataset a job iterates, its own or
Keras' for fit and fit's validation, is iterated with autotuning off
(``iterated_without_autotuning``): no such thread exists. The pipeline's
``AUTOTUNE`` values then take tf.data's fixed defaults (a parallel map runs on
the machine's cores, at most 16; ``prefetch(AUTOTUNE)`` keeps its own buffer
tuner); what the pipeline yields, and its order, are unchanged.

Note [The prefetch tf.data would add]
With autotuning on, tf.data also rewrites a pipeline whose last transformation
is synchronous to end in a prefetch (its ``inject_prefetch`` optimization), so
under ``fit`` a loader's next batch is made while the step runs. Turned off
with autotuning, that overlap went too: a Keras job on a ``tf.data`` dataset of
batches 200 ms late (benchmarks/keras_tuner_bench.py ``--model io-mem``) spent
12.0 s a trial on its data and 2.7-4.4 s on its steps, one after the other,
where fit spends about 12.4 s on both. So a Keras job iterates its dataset as
TensorFlow would (``iterated_as_tf_data_would``): autotuning off and, where the
pipeline does not already end in a prefetch (Keras' adapters for arrays,
generators and ``PyDataset`` end in one), one element of prefetch added, as
tf.data would inject it (one element: the buffer tuner is autotuning's), and
none under op determinism, where tf.data injects none either (measured: with
``tf.config.experimental.enable_op_determinism`` fit makes no batch ahead). What
it yields and its order are unchanged; the batch made ahead is made by the
pipeline's thread, on the pool's default stream, as every batch of a pipeline
is (Note [Data held elsewhere] in tensile_tf/tf/step_memory.py): admission
counts it among the bytes held outside the jobs (measured, 4 MiB batches: the
default stream held 8-12 MiB at a batch's end, 4-8 MiB without the prefetch).
The prefetch's own thread ends at once with its iterator (benchmarks/
iterator_teardown_bench.py: 0 of 20 deletions above 50 ms, at most 1.8 ms).
Only a Keras job's batches (``keras_fit.iterated_as_under_fit``) are iterated
so: a YAML job's own pipeline makes only the batch its step reads (this
module's docstring; ``data.prefetch`` asks for the next one). Not done: a pipeline ending in another asynchronous
transformation (a parallel map) is given the prefetch too, one batch more than
under fit.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from tensile_tf.config.schema import JobSpec


class DataError(ValueError):
    """A job's data cannot be read or does not match the job; says which file and what to do."""


def _load_npy(path: str, what: str, job: str) -> np.ndarray:
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"job {job!r}: data.{what} {path!r} does not exist; give the path of a NumPy file")
    try:
        return np.load(p, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DataError(f"job {job!r}: data.{what} {path!r} is not a readable NumPy file ({e})") from None


def _load_tfrecords(spec: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """Every ``tf.train.Example`` of the files ``data.path`` names (a glob):
    the float feature ``x_key`` (one example, flattened) and the int64
    feature ``y_key`` (its class)."""
    data, job = spec.data, spec.name
    files = sorted(tf.io.gfile.glob(str(Path(data.path).expanduser())))
    if not files:
        raise DataError(f"job {job!r}: data.path {data.path!r} matches no TFRecord file; give a file or a glob")
    xs, ys = [], []
    for f in files:
        try:
            for raw in tf.data.TFRecordDataset(f):
                ex = tf.train.Example.FromString(raw.numpy())
                feats = ex.features.feature
                missing = [k for k in (data.x_key, data.y_key) if k not in feats]
                if missing:
                    raise DataError(f"job {job!r}: a record of {f!r} has no feature {missing[0]!r} (it has "
                                    f"{sorted(feats)}); set data.x_key and data.y_key to its features' names")
                xs.append(np.asarray(feats[data.x_key].float_list.value, dtype=np.float32))
                label = feats[data.y_key]
                ys.append(label.int64_list.value[0] if label.int64_list.value else label.float_list.value[0])
        except tf.errors.DataLossError as e:
            raise DataError(f"job {job!r}: {f!r} is not a TFRecord file ({e.message})") from None
    if not xs:
        raise DataError(f"job {job!r}: the TFRecord files of {data.path!r} hold no records")
    if len({len(a) for a in xs}) > 1:
        raise DataError(f"job {job!r}: the records' {data.x_key!r} features differ in length; every example "
                        "must have the same number of values")
    return np.stack(xs), np.asarray(ys)


def _load_image_dir(spec: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """The images under ``data.path``, one subdirectory per class (sorted
    names are classes 0, 1, ...), through Keras' loader, resized to
    ``input_shape`` and scaled to [0, 1]."""
    import keras

    data, job = spec.data, spec.name
    root = Path(data.path).expanduser()
    if not root.is_dir():
        raise DataError(f"job {job!r}: data.path {data.path!r} is not a directory; give the directory that "
                        "holds one subdirectory of images per class")
    shape = tuple(spec.input_shape or ())
    if len(shape) != 3 or shape[2] not in (1, 3, 4):
        raise DataError(f"job {job!r}: data kind image_dir needs input_shape [height, width, channels] with "
                        f"1, 3 or 4 channels, got {list(shape)}")
    mode = {1: "grayscale", 3: "rgb", 4: "rgba"}[shape[2]]
    try:
        ds = keras.utils.image_dataset_from_directory(root, labels="inferred", label_mode="int", color_mode=mode,
                                                      image_size=shape[:2], batch_size=None, shuffle=False,
                                                      verbose=False)
    except ValueError as e:
        raise DataError(f"job {job!r}: data.path {data.path!r}: {e}") from None
    classes = len(ds.class_names)
    if classes > spec.classes:
        raise DataError(f"job {job!r}: {data.path!r} has {classes} class directories but classes is "
                        f"{spec.classes}; set classes: {classes}")
    xs, ys = [], []
    files = list(getattr(ds, "file_paths", ()))   # in the dataset's order (shuffle=False)
    examples = iter(iterated_without_autotuning(ds))
    while True:
        try:
            image, label = next(examples)
        except StopIteration:
            break
        except tf.errors.InvalidArgumentError as e:   # TensorFlow's "jpeg::Uncompress failed" names no file
            name = files[len(xs)] if len(xs) < len(files) else "an image"
            raise DataError(f"job {job!r}: data.path {data.path!r}: cannot decode {name} "
                            f"({e.message.splitlines()[0] if e.message else type(e).__name__}); "
                            "remove or replace the file (`tensile validate --data` checks every file)") from None
        xs.append(image.numpy() / 255.0)
        ys.append(int(label))
    if not xs:
        raise DataError(f"job {job!r}: {data.path!r} holds no images in its class directories")
    return np.stack(xs).astype(np.float32), np.asarray(ys, dtype=np.int32)


def load_examples(spec: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a job whose ``data.kind`` reads examples (EXAMPLE_KINDS), x shaped
    (n, *input_shape) float32, y (n,) int32 class indices (or float targets)."""
    data, job = spec.data, spec.name
    if data.kind == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = (d.images / 16.0).astype(np.float32), d.target.astype(np.int32)
    elif data.kind == "npz":
        archive = _load_npy(data.path, "path", job)
        missing = [k for k in (data.x_key, data.y_key) if k not in archive]
        if missing:
            raise DataError(f"job {job!r}: data.path {data.path!r} has no array {missing[0]!r} (it has "
                            f"{sorted(archive.files)}); set data.x_key and data.y_key to its arrays' names")
        x, y = archive[data.x_key], archive[data.y_key]
    elif data.kind == "npy":
        x, y = _load_npy(data.path, "path", job), _load_npy(data.labels_path, "labels_path", job)
    elif data.kind == "tfrecord":
        x, y = _load_tfrecords(spec)
    elif data.kind == "image_dir":
        x, y = _load_image_dir(spec)
    else:
        raise ValueError(f"load_examples: data kind {data.kind!r} has no examples to load")
    if len(x) != len(y):
        raise DataError(f"job {job!r}: {len(x)} examples but {len(y)} labels; they must pair up one to one")
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y)
    y = y.astype(np.int32) if np.issubdtype(y.dtype, np.integer) else y.astype(np.float32)
    if spec.input_shape is not None:
        shape = tuple(spec.input_shape)
        if int(np.prod(x.shape[1:])) != int(np.prod(shape)):
            raise DataError(f"job {job!r}: each example has shape {list(x.shape[1:])}, which does not fit "
                            f"input_shape {list(shape)}; set input_shape to it")
        x = x.reshape((len(x), *shape))
    if np.issubdtype(y.dtype, np.integer) and len(y) and (y.min() < 0 or y.max() >= spec.classes):
        raise DataError(f"job {job!r}: labels run from {int(y.min())} to {int(y.max())}, outside 0..{spec.classes - 1}; "
                        f"set classes: {int(y.max()) + 1}")
    return x, y


def load_validation_examples(spec: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """A job's own validation examples (``data.validation_path``, and
    ``validation_labels_path`` for npy), read as its training examples are."""
    data = spec.data.model_copy(update={"path": spec.data.validation_path,
                                        "labels_path": spec.data.validation_labels_path or spec.data.labels_path,
                                        "validation_path": None, "validation_labels_path": None})
    try:
        return load_examples(spec.model_copy(update={"data": data}))
    except DataError as e:   # say which setting named the file
        raise DataError(str(e).replace("data.path", "data.validation_path")
                        .replace("data.labels_path", "data.validation_labels_path")) from None


def split_examples(x: np.ndarray, y: np.ndarray, share: float, seed: int, job: str, batch_size: int):
    """(train x, train y, validation x, validation y): ``share`` of the
    examples, chosen with ``seed``, held out (none when share is 0)."""
    order = np.random.default_rng(seed).permutation(len(x))
    held = int(math.ceil(share * len(x))) if share else 0
    train, val = order[held:], order[:held]
    if len(train) < batch_size:
        raise DataError(f"job {job!r}: {len(train)} training examples, fewer than one batch of {batch_size}; "
                        "lower batch_size or data.validation_split")
    return x[train], y[train], x[val], y[val]


def iterated_without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with tf.data's autotuning off (Note [No autotuning thread per job]);
    anything else (a distributed dataset, a generator) is returned as it is."""
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def iterated_as_tf_data_would(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with autotuning off (Note [No autotuning thread per job]) and the prefetch
    tf.data would have added with it on (Note [The prefetch tf.data would add]); anything
    else (a distributed dataset, a generator) is returned as it is."""
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    last = dataset
    while type(last).__name__ == "_OptionsDataset":   # with_options: the transformation it wraps
        last = last._input_dataset  # noqa: SLF001 - tf_plugin/tf_internals.py
    if type(last).__name__ != "_PrefetchDataset" and not tf_config.is_op_determinism_enabled():
        dataset = dataset.prefetch(1)
    return iterated_without_autotuning(dataset)


def training_batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int) -> tf.data.Dataset:
    """Shuffled with ``seed`` each epoch, whole batches only, repeated."""
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=True).repeat()


def _metric(name: str, sparse_labels: bool):
    import keras

    if name in ("accuracy", "acc"):
        return keras.metrics.SparseCategoricalAccuracy(name="accuracy") if sparse_labels else \
            keras.metrics.CategoricalAccuracy(name="accuracy")
    try:
        metric = keras.metrics.get(name)
    except (ValueError, TypeError) as e:
        raise DataError(f"metric {name!r} is not a Keras metric ({e}); use e.g. accuracy, auc, "
                        "sparse_top_k_categorical_accuracy") from None
    if isinstance(metric, type):
        metric = metric()
    if not isinstance(metric, keras.metrics.Metric):
        metric = keras.metrics.MeanMetricWrapper(metric, name=name)
    return metric


@dataclass
class ValidationRecord:
    """One validation of a job (results.json ``validation``)."""

    step: int                 # steps trained when it ran
    at_s: float
    loss: float
    metrics: dict[str, float]
    seconds: float


@dataclass
class Validator:
    """Evaluates a job's model on its validation examples (see the module docstring)."""

    model: Any
    loss_fn: Callable
    x: np.ndarray
    y: np.ndarray
    batch_size: int
    metric_names: Sequence[str]
    every: int | None
    records: list[ValidationRecord] = field(default_factory=list)
    _forward: Any = field(default=None, repr=False)
    attributed: Callable[[Callable], Callable] = field(default=lambda fn: fn, repr=False)

    def due(self, steps_done: int, total: int) -> bool:
        return steps_done == total or (self.every is not None and steps_done % self.every == 0)

    def _forward_fn(self):
        if self._forward is None:
            model = self.model
            self._forward = tf.function(self.attributed(lambda x: model(x, training=False)))
        return self._forward

    def attribute_to(self, attributed: Callable[[Callable], Callable] | None) -> None:
        """The forward traced as ``attributed(forward)`` from now on: the job's stream's
        ``JobStream.attributed``, whose allocations are then the job's (None: not attributed)."""
        self.attributed, self._forward = attributed or (lambda fn: fn), None

    def run_one_batch(self) -> None:
        """The first batch's forward and loss, nothing recorded: what one batch of validation takes
        (Note [Work outside the steps, inside the allowance] in tensile_tf/runtime/work_outside_steps.py)."""
        xb, yb = tf.constant(self.x[:self.batch_size]), tf.constant(self.y[:self.batch_size])
        float(tf.reduce_mean(self.loss_fn(yb, self._forward_fn()(xb))))

    def run(self, steps_done: int, now_s: float) -> ValidationRecord:
        t = time.perf_counter()
        self._forward_fn()
        sparse = np.issubdtype(self.y.dtype, np.integer)
        metrics = [_metric(n, sparse) for n in self.metric_names]
        losses, weights = [], []
        for i in range(0, len(self.x), self.batch_size):
            xb, yb = tf.constant(self.x[i:i + self.batch_size]), tf.constant(self.y[i:i + self.batch_size])
            out = self._forward(xb)
            losses.append(float(tf.reduce_mean(self.loss_fn(yb, out))))
            weights.append(len(xb))
            for m in metrics:
                m.update_state(yb, out)
        loss = float(np.average(losses, weights=weights)) if losses else math.nan
        record = ValidationRecord(steps_done, now_s, loss, {m.name: float(m.result()) for m in metrics},
                                  time.perf_counter() - t)
        self.records.append(record)
        return record
