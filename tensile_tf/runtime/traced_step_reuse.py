"""A finished job's traced step, kept for the next job of the same graph.

Note [Reusing a finished job's traced step]
Tracing a job's step (Python running the model, the tape and the optimizer
into a graph) and instantiating it is the largest cost the run loop pays
per job: on the MLP search of 12 trials it was about half of the run
loop's busy time, done serially while the other trials train (issue 43).
Search trials often differ only in what the step reads from variables (the
learning rate, the initial weights) and not in its graph. So when a job
ends (finished, or stopped by its search's pruner), its traced step, model,
optimizer and pool stream are parked on the host's shelf
(``TracedStepShelf``) instead of dropped; a later job whose spec has the
same ``reuse_key`` (everything but its name, seed, length, and learning
rate) takes them over:

1. its own model, optimizer and data are built as always (the same
   ``build_train_step``, the same seed), and its optimizer's variables made
   (``optimizer.build``);
2. every value is copied into the parked variables: model variables (the
   seed generators' states included) and optimizer variables (iteration,
   learning rate, slots), pairwise, after checking that their shapes and
   dtypes match; its own model and optimizer are then dropped;
3. it trains the parked step on its own batches, under the parked stream
   renamed to its name (``JobStream.rename``).

Its step therefore starts from the very values its own build made and
computes what its own trace would (bit for bit, tests/tf/
test_traced_step_reuse.py). A step that may be parked is traced for every
batch size (Note [One trace for every batch size]), so the batch size is
not in the key either. A step is parked only if its traced graph reads
no variable other than the model's and the optimizer's (a step that captured
anything else would carry it over), and not from a node-group pipeline (its
steps are rewritten per job) or a saved plan (``--plan``: its op names are its
first owner's), nor for a ``keras_file`` or ``train_step_factory`` job (what
such a step captures is the user's). The learning rate leaves the key because Keras
keeps it in a variable the step reads; every other optimizer argument is a
constant in the graph and stays in it.

A parked step holds its variables' pool bytes: the pool reports them under
``parked:<n>`` and ``held_outside_jobs`` counts them, so admission never
places a job in memory a parked step holds. When admission finds that a
job does not fit, the shelf is emptied first (``TracedStepShelf.evict``,
via ``AdmissionControl.make_room``) and the job asked again. The shelf
keeps at most ``MAX_PARKED`` steps, the newest, and is emptied when the run
ends. ``run.reuse_traced_steps: false`` turns it off; a job's record says
whose step it took (``traced_step_from``).

Note [Steps kept for the jobs that wait]
Emptying the whole shelf for a job that does not fit dropped the very step
that job would take over: in a search whose trials fit only planned (issue
58), every trial that arrived with the pool full evicted the step of the trial
before it, and no trial reused one. The parked step a job would take becomes
that job's: its variables are what the job's own build copies its values
into. So admission counts its bytes as the job's (``bytes_for``: taken off
what is held outside the jobs), and ``evict(keep_for=job)`` drops every
other parked step. The job's build holds its own model beside the parked one
for a moment; where that runs out of memory, the build fails as any build
beside running jobs does, the shelf is emptied (``_evict_parked``) and the
job tried again later.

Note [One trace for every batch size]
A search's trials mostly differ in batch size as well as in learning rate:
on the MLP search (4 batch sizes, 12 trials, 4 at once) steps traced for
their own batch size left 7 of 12 trials tracing, and packed trials spent
more CPU per trial than Optuna's threads, that difference being the run
loop's Python (issue 43). So a step that may be parked is traced once with
its inputs' batch dimension left free (``batch_free_specs``: the first
batch's TensorSpecs, dimension 0 None); a call with any batch size
dispatches to that trace (tf.function picks the trace whose signature is a
supertype of the call's), and any job of its key may take it over. Keras
models carry no batch size (``keras.Input`` leaves it free), so their
graphs differ only in the shapes TensorFlow infers: the same kernels run on
the same values. Measured bit for bit against a trace of the batch's own
shape, losses and weights after 5-20 steps, each at two or three batch
sizes: the MLP, the small CNN, the residual net (batch norm), the
Transformer encoder and MobileNetV2 (alpha 0.35), with step times within
the run-to-run spread (the MLP at batch 32 and 128, 300 steps, three
rounds: 1.02-1.46 ms a step traced for its own shape, 1.00-1.65 ms
batch-free). A step whose code needs a static batch size
(``x.shape[0]`` used as a number) fails that trace and is traced for its
own batch; parked, it is taken over only by jobs of that batch size
(``ParkedStep.batch_size``).

Note [Reuse under a planner]
Issue 58: packed search is where planning pays (trials that fit the pool only
when planned), and reuse is what made packed search faster than Optuna's
threads, so the two work together. A plan is a function of the graph and the
latencies, and each job's plan is rewritten into a step of its own (its swap
ops, its plan table, its host copies filed under its stream): so what is parked
is the step the plans were made from, the job's unplanned traced step
(``CapturedJob.job.step_fn``, kept by teardown before the capture is dropped),
after the plan's variables are back in the pool and its host copies released;
its plan-table step, if one was built, is forgotten. A job that takes it over
is probed, captured and planned from it as from its own trace (the current
plan applied to it; re-plans as for any job). With a planner a step is traced
for its own batch's shapes (a trace for every batch size leaves the batch
dimension free, and a capture would count its activations as nothing), so it
is taken over only by jobs of that batch size (``ParkedStep.batch_size``).

Note [Captures kept with the step]
A capture (the graph, its measured scratch and latencies) is a function of
the traced step, so a job that takes over a parked step needs none of its
own: the step is parked with its owner's capture (``ParkedStep.captured``),
and the taker is planned from it under its own name (``CapturedJob.for_job``)
instead of profiling the same step again. On the memory-bound search of
issue 58 every trial after the first took over a step, and each capture was
about 2 s of profiled steps on the run loop's thread (24.9 s over 12 trials).
A taker that arrives to a full pool and is planned together with the running
jobs (Note [Joint re-plan on arrival] in replanning.py) is planned from it
too, not from its graph alone (a cold capture, whose guessed latencies and
scratch planned such trials too tight: 11 out-of-memory retries in that
search). The taker still runs its probe step (P and T are measured) and its
latencies are corrected while it runs, as any job's (Note [Latency drift]).
"""
from __future__ import annotations

import gc
import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tensile_tf.jobs.job import TrainStep
from tf_plugin.tf_internals import forget_custom_gradients

if TYPE_CHECKING:
    from tensile_tf.config.schema import JobSpec
    from tensile_tf.runtime.records import JobState
    from tensile_tf.tf.pool import JobStream

MAX_PARKED = 4   # steps kept at most (a search runs a few graph shapes at once)
PARKED_PREFIX = "parked:"   # pool stream names of parked steps (job names cannot hold a colon)

# Fields that do not change a YAML job's traced step: who it is, how long it
# trains, when it arrives, its initial values (seed), its learning rate (a
# variable the step reads) and its batch size (checked by ``take``: Note
# [One trace for every batch size]).
_NOT_IN_THE_GRAPH = {"name", "seed", "steps", "epochs", "steps_per_epoch", "stop_on_nan", "arrive_at_s",
                     "batch_size"}


def reuse_key(spec: "JobSpec | None") -> str | None:
    """What two jobs must share for one to take over the other's traced
    step; None: the job's step is never parked or taken over."""
    if spec is None or spec.model.keras_file or spec.model.train_step_factory:
        return None
    return (spec.model_dump_json(exclude=_NOT_IN_THE_GRAPH | {"optimizer"})
            + spec.optimizer.model_dump_json(exclude={"learning_rate"}))


def batch_free_specs(batch: tuple) -> tuple | None:
    """``batch``'s TensorSpecs with dimension 0 left free; None if an input
    has no batch dimension (Note [One trace for every batch size])."""
    specs = []
    for x in batch:
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is None or dtype is None or len(shape) == 0:
            return None
        specs.append(tf.TensorSpec([None, *shape[1:]], tf.as_dtype(dtype)))
    return tuple(specs)


def trace_step(step_fn: Any, first_batch: tuple, *, any_batch: bool, input_specs: tuple | None = None) -> None:
    """Traces ``step_fn`` once: with the job's own ``input_specs`` where it has them (a Keras
    job's, fit's shapes: ``TrainStep.input_specs``), else for every batch size if ``any_batch``
    and its code allows it, else for ``first_batch``'s shapes."""
    if input_specs is not None:
        step_fn.get_concrete_function(*input_specs)
        return
    specs = batch_free_specs(first_batch) if any_batch else None
    if specs is not None:
        try:
            step_fn.get_concrete_function(*specs)
            return
        except Exception:  # noqa: BLE001 - its code needs a static batch size: traced for its own below
            pass
    step_fn.get_concrete_function(*first_batch)


def batch_size_traced(concrete: Any) -> int | None:
    """The one batch size a trace takes; None: any (its inputs' dimension 0
    free); -1: no single one (an input without a batch dimension, or two
    sizes), so no other job's."""
    sizes = {spec.shape[0] if spec.shape.rank else -1 for spec in tf.nest.flatten(concrete.structured_input_signature)
             if isinstance(spec, tf.TensorSpec)}
    return None if sizes == {None} else (sizes.pop() if len(sizes) == 1 else -1)


@dataclass
class ParkedStep:
    key: str
    owner: str              # the ended job that parked it
    batch_size: int | None  # the only batch size its trace takes; None: any (Note [One trace for every batch size])
    stream: "JobStream"
    train: TrainStep        # the parked model, optimizer and variables (its batches dropped)
    step_fn: Any            # the traced, attributed tf.function
    custom_gradients: set[str]   # registered by its trace (Note [Custom gradients keep traced jobs alive])
    captured: Any = None    # its owner's CapturedJob of this step (Note [Captures kept with the step])


def _values(obj: Any) -> list:
    """The tf.Variables behind Keras variables (or tf.Variables)."""
    return [getattr(v, "value", v) for v in obj]


def _model_and_optimizer_variables(train: TrainStep) -> list:
    return [*train.model.variables, *train.optimizer.variables]


def _same_layout(mine: list, theirs: list) -> bool:
    """Pairwise the same shapes and dtypes (names differ: Keras numbers each build's layers)."""
    return len(mine) == len(theirs) and all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(mine, theirs))


class TracedStepShelf:
    """The host's parked steps, newest last (Note [Reusing a finished job's traced step])."""

    def __init__(self, enabled: bool, *, planned: bool = False):
        self.enabled = enabled
        self.planned = planned   # Note [Reuse under a planner]: steps traced for their own batch
        self._parked: OrderedDict[int, ParkedStep] = OrderedDict()   # by stream id
        self._numbers = itertools.count()
        self.taken = 0    # jobs that took over a parked step
        self.evicted = 0  # parked steps dropped unused

    def park(self, state: "JobState", step_fn: Any, captured: Any = None) -> bool:
        """Keeps an ended job's unplanned traced ``step_fn`` (with its stream, model,
        optimizer, and ``captured``, its capture) if it may be taken over (Note [Reuse under a
        planner]); True: parked, and ``state`` no longer holds them."""
        from tensile_tf.tf.rewrite.plan_table import forget_table_step

        key = reuse_key(state.job.spec) if self.enabled else None
        train, stream = state.rt.train, state.rt.job_stream
        if (key is None or train is None or step_fn is None or stream is None or train.model is None
                or train.optimizer is None or state.rt.example_args is None):
            return False
        try:   # the step reads nothing but the model's and the optimizer's variables
            concrete = step_fn.get_concrete_function(*state.rt.example_args)
        except Exception:  # noqa: BLE001 - a step that cannot say what it reads is not kept
            return False
        known = {id(v) for v in _values(_model_and_optimizer_variables(train))}
        if any(id(v) not in known for v in concrete.graph.variables):
            return False
        train.batches, train.validator, train._iterator = (), None, None
        forget_table_step(step_fn)   # the owner's plan table (its rows name the owner's plan)
        stream.rename(f"{PARKED_PREFIX}{next(self._numbers)}")
        self._parked[stream.stream] = ParkedStep(key, state.name, batch_size_traced(concrete), stream, train, step_fn,
                                                 state.rt.custom_gradients, captured)
        state.rt.custom_gradients = set()   # the parked step's now: forgotten when it is dropped
        while len(self._parked) > MAX_PARKED:
            self._drop_oldest()
        return True

    def _takeable(self, state: "JobState | None") -> int | None:
        """The stream id of the newest parked step ``state``'s job may take over, or None."""
        key = reuse_key(state.job.spec) if self.enabled and state is not None else None
        for sid, parked in reversed(self._parked.items()):
            if key is not None and parked.key == key and parked.batch_size in (None, state.job.spec.batch_size):
                return sid
        return None

    def bytes_for(self, state: "JobState") -> int:
        """Pool bytes of the parked step ``state``'s job would take over: its own once it starts
        (Note [Steps kept for the jobs that wait])."""
        sid = self._takeable(state)
        return self._parked[sid].stream.stats().get("current", 0) if sid is not None else 0

    def take(self, state: "JobState") -> ParkedStep | None:
        """The newest parked step ``state``'s job may take over (off the shelf), or None."""
        sid = self._takeable(state)
        if sid is None:
            return None
        parked = self._parked.pop(sid)
        state.rt.custom_gradients |= parked.custom_gradients   # forgotten at the job's teardown
        parked.stream.rename(state.name)
        parked.stream.reset_peak()
        return parked

    def adopt(self, parked: ParkedStep, fresh: TrainStep) -> TrainStep | None:
        """Step 2 of the Note: ``fresh``'s values into the parked variables, and
        ``fresh`` made to train the parked model with its own batches; None if
        their variables differ (then ``fresh`` is trained, traced anew)."""
        if fresh.model is None or fresh.optimizer is None or type(fresh.optimizer) is not type(parked.train.optimizer):
            return None
        fresh.optimizer.build(fresh.model.trainable_variables)
        mine, theirs = _model_and_optimizer_variables(fresh), _model_and_optimizer_variables(parked.train)
        if not _same_layout(mine, theirs):
            return None
        for source, target in zip(mine, theirs):
            target.assign(source)
        parked_train = parked.train
        if fresh.validator is not None:
            fresh.validator.model = parked_train.model
        # the parked model and step; the job's own batches (and where its iterator stands)
        fresh.step_fn, fresh.variables = parked_train.step_fn, parked_train.variables
        fresh.model, fresh.optimizer = parked_train.model, parked_train.optimizer
        self.taken += 1
        return fresh

    def may_park(self, state: "JobState") -> bool:
        """Whether ``state``'s step may be parked when its job ends."""
        return self.enabled and reuse_key(state.job.spec) is not None

    def traces_any_batch(self, state: "JobState", needs_no_plan: bool = False) -> bool:
        """Whether ``state``'s step is traced for every batch size (Note [One trace for every
        batch size]): one that may be parked, unless it is planned (Note [Reuse under a planner]) and
        may need a plan (Note [Captures a plan needs] in planning.py)."""
        return self.may_park(state) and (not self.planned or needs_no_plan)

    def evict(self, keep_for: "JobState | None" = None) -> int:
        """Drops every parked step but the one ``keep_for``'s job would take over (Note [Steps
        kept for the jobs that wait]); the pool bytes they held (now free)."""
        kept = self._takeable(keep_for)
        return self._drop([sid for sid in self._parked if sid != kept])

    def _drop_oldest(self) -> None:
        self._drop([next(iter(self._parked))])

    def _drop(self, sids: list[int]) -> int:
        """Drops the parked steps of ``sids``; the pool bytes they held (now free)."""
        if not sids:
            return 0
        dropped = [self._parked.pop(sid) for sid in sids]
        held = sum(p.stream.stats().get("current", 0) for p in dropped)
        streams = [p.stream for p in dropped]
        forget_custom_gradients(set().union(*(p.custom_gradients for p in dropped)))
        self.evicted += len(dropped)
        del dropped
        _release_once_collected(streams)
        return held


def _release_once_collected(streams: list) -> None:
    """The dropped steps' models and functions hold reference cycles: their
    bytes return once collected; then their streams are released."""
    gc.collect()
    for stream in streams:
        stream.release()


__all__ = ["MAX_PARKED", "PARKED_PREFIX", "ParkedStep", "TracedStepShelf", "batch_free_specs", "batch_size_traced", "reuse_key", "trace_step"]
