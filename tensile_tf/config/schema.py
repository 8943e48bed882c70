"""The YAML run configuration: schema, validation, and errors that point at
the file, line and column.

A configuration names the pool, the run settings and the jobs::

    pool: 2GiB
    run: {concurrency: 4, out_dir: runs/quickstart, admission: salus}
    jobs:
      - name: cnn-a
        model: {builder: "tensile_tf.jobs.zoo:small_cnn", args: {classes: 10}}
        input_shape: [32, 32, 3]
        classes: 10
        batch_size: 64
        optimizer: {name: adam, learning_rate: 0.001}
        steps: 40

Unknown keys are rejected. ``load_config(path)`` raises ``ConfigError`` whose
message lists every problem as ``file:line:column: jobs[0].batch_size: ...``.
"""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from tensile_tf.config.device_links import parse_swap_link
from tensile_tf.config.yaml_nodes import LazyMarks, duplicate_keys, parse_data, parse_tree
from tensile_tf.units import parse_bytes


class ConfigError(ValueError):
    """A configuration file is unreadable or invalid; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """Exactly one of: a keras.applications name, a model builder, a whole train-step factory
    ("module:function"; ``args`` go to it as keywords), or a compiled model saved by Keras."""

    application: StrictStr | None = Field(None, description="keras.applications name, e.g. ResNet50")
    builder: StrictStr | None = Field(
        None, description="'module:function' returning a keras.Model or a dict with model, "
        "optimizer, loss and/or dataset")
    train_step_factory: StrictStr | None = Field(
        None, description="'module:function' returning a tensile_tf.TrainStep")
    keras_file: StrictStr | None = Field(None, description="a compiled model saved by Keras (.keras): its "
                                         "optimizer, loss and metrics replace optimizer: and loss:")
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _exactly_one(self) -> "ModelSpec":
        given = [k for k in ("application", "builder", "train_step_factory", "keras_file") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of 'application', 'builder', 'train_step_factory' or 'keras_file' "
                             f"(got {', '.join(given) if given else 'none'})")
        for key in ("builder", "train_step_factory"):
            ref = getattr(self, key)
            if ref is not None and (ref.count(":") != 1 or not all(ref.split(":"))):
                raise ValueError(f"{key} must look like 'package.module:function', got {ref!r}")
        return self


class OptimizerSpec(_Strict):
    name: StrictStr = "adam"
    learning_rate: StrictFloat = Field(1e-3, gt=0)
    args: dict[str, Any] = Field(default_factory=dict, description="other keras optimizer keywords")


#: Data kinds read from the user's files, and what their ``path`` is.
FILE_KINDS = {"npz": "the .npz file", "npy": "the .npy file of examples",
              "tfrecord": "a TFRecord file or a glob of them", "image_dir": "a directory with one subdirectory per class"}
#: Data kinds whose examples are read once and split (``validation_split``).
EXAMPLE_KINDS = frozenset({*FILE_KINDS, "digits"})


class DataSpec(_Strict):
    """Where a job's (x, y) examples come from (tensile_tf/jobs/datasets.py):

    * ``synthetic`` (default): fixed random batches made once per job;
    * ``function``: 'module:function' returning a tf.data.Dataset of (x, y) batches;
    * ``npz``: a NumPy ``.npz`` file (``path``) with arrays ``x_key`` and ``y_key``;
    * ``npy``: two ``.npy`` files, ``path`` (examples) and ``labels_path``;
    * ``tfrecord``: TFRecord files (``path``: a file or a glob) of
      ``tf.train.Example``s, each with a float feature ``x_key`` (one
      example, flattened; reshaped to ``input_shape``) and an int64 feature
      ``y_key`` (its class);
    * ``image_dir``: a directory of images, one subdirectory per class (Keras'
      ``image_dataset_from_directory``: PNG, JPEG, BMP, GIF), resized to
      ``input_shape`` [height, width, channels] and scaled to [0, 1];
    * ``digits``: scikit-learn's bundled 8x8 digits (1797 images, 10
      classes; no download), shaped as the job's ``input_shape`` ([8, 8, 1] or [64]).

    Files are read once; the examples are shuffled with the job's seed each
    epoch. ``validation_split`` holds out that share of them (chosen with the
    seed) for validation (``validate_every`` and ``metrics`` on the job)."""

    kind: Literal["synthetic", "function", "npz", "npy", "tfrecord", "image_dir", "digits"] = "synthetic"
    function: StrictStr | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    num_batches: StrictInt = Field(4, ge=1, description="distinct synthetic batches cycled through, held in host "
                                   "memory; the pool holds the step's batch (and the next with `prefetch`)")
    prefetch: StrictBool = Field(False, description="synthetic data: copy the next batch into the pool before the "
                                 "step runs, as well as the step's own (Note [Just-in-time batches] in "
                                 "tensile_tf/jobs/job.py: it holds a second batch through the other jobs' peaks and "
                                 "hides no copy here)")
    path: StrictStr | None = Field(None, description="npz: the file; npy: the examples' file; tfrecord: a file "
                                   "or glob; image_dir: the directory of class subdirectories")
    labels_path: StrictStr | None = Field(None, description="npy: the labels' file")
    x_key: StrictStr = "x"
    y_key: StrictStr = "y"
    validation_split: StrictFloat = Field(0.0, ge=0.0, lt=1.0, description="share of the examples held out")
    validation_path: StrictStr | None = Field(None, description="validation examples of their own, read as `path` "
                                              "is (same kind, keys and shape) instead of a split")
    validation_labels_path: StrictStr | None = Field(None, description="npy: the validation labels' file")

    @property
    def device_batches(self) -> int:
        """Synthetic batches the job holds in the pool (Note [Input data on the host] in
        tensile_tf/jobs/job.py): the one its step reads, and the next with ``prefetch``."""
        return min(2 if self.prefetch else 1, self.num_batches)

    @property
    def has_validation(self) -> bool:
        return bool(self.validation_split or self.validation_path)

    @model_validator(mode="after")
    def _source_given(self) -> "DataSpec":
        if self.kind == "function" and not self.function:
            raise ValueError("data kind 'function' needs function: 'module:function'")
        if self.kind in FILE_KINDS and not self.path:
            raise ValueError(f"data kind {self.kind!r} needs path: {FILE_KINDS[self.kind]}")
        if self.kind == "npy" and not self.labels_path:
            raise ValueError("data kind 'npy' needs labels_path: the .npy file of labels")
        if self.validation_path and self.kind not in FILE_KINDS:
            raise ValueError(f"validation_path needs a data kind read from files ({', '.join(FILE_KINDS)}), "
                             f"not {self.kind!r}")
        if self.validation_path and self.validation_split:
            raise ValueError("give validation_split or validation_path, not both")
        if self.kind == "npy" and self.validation_path and not self.validation_labels_path:
            raise ValueError("data kind 'npy' with validation_path needs validation_labels_path: the .npy file "
                             "of validation labels")
        if self.validation_split and self.kind in ("synthetic", "function"):
            raise ValueError("validation_split needs examples to split: data kind npz, npy, tfrecord, image_dir "
                             f"or digits, not {self.kind!r}")
        return self


class JobSpec(_Strict):
    name: StrictStr = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    model: ModelSpec
    input_shape: tuple[StrictInt, ...] | None = Field(None, description="per-example input shape")
    classes: StrictInt = Field(10, ge=2)
    data: DataSpec = Field(default_factory=DataSpec)
    batch_size: StrictInt = Field(32, ge=1)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    loss: StrictStr = "sparse_categorical_crossentropy"
    steps: StrictInt | None = Field(None, ge=1)
    epochs: StrictInt | None = Field(None, ge=1)
    steps_per_epoch: StrictInt | None = Field(None, ge=1)
    seed: StrictInt = 0
    stop_on_nan: StrictBool = True
    max_swapping_rate: StrictFloat = Field(1.0, gt=0, le=1, description="TENSILE: the job's cap on its share "
                                     "of swapped tensors, also its swap priority")
    start_offset_s: StrictFloat = Field(0.0, ge=0, description="planner: when the job's first iteration starts")
    arrive_at_s: StrictFloat = Field(0.0, ge=0, description="when the job arrives, in seconds after the run "
                                     "starts (0: at the start); it is probed, planned and admitted then")
    metrics: tuple[StrictStr, ...] = Field(("accuracy",), description="Keras metrics computed on the validation "
                                           "examples (data.validation_split or data.validation_path)")
    validate_every: StrictInt | None = Field(None, ge=1, description="steps between validations (and at the end); "
                                             "default: at the end only")
    checkpoint_every: StrictInt | None = Field(None, ge=1, description="also save the model in Keras' format every "
                                               "N steps (models/JOB.stepN.keras); the finished model is always saved")

    @model_validator(mode="after")
    def _length(self) -> "JobSpec":
        if self.steps is None and self.epochs is None:
            raise ValueError("give 'steps', or 'epochs' with 'steps_per_epoch'")
        if self.epochs is not None and self.steps_per_epoch is None:
            raise ValueError("'epochs' needs 'steps_per_epoch' (steps in one epoch)")
        if self.model.application and self.input_shape is None:
            raise ValueError("a keras.applications model needs 'input_shape', e.g. [64, 64, 3]")
        if self.validate_every is not None and not self.data.has_validation:
            raise ValueError("'validate_every' needs validation examples: set data.validation_split, e.g. 0.2, "
                             "or data.validation_path")
        return self

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else self.epochs * self.steps_per_epoch


class Admission(str, Enum):
    salus = "salus"            # persistent of all + largest temporary (seed 002 §2.2)
    sum = "sum"                # persistent of all + every temporary (free-running safe)
    none = "none"              # admit up to the concurrency limit


class PlannerKind(str, Enum):
    none = "none"
    tensile = "tensile"        # seed 000: swaps and recomputation planned across the jobs


class PipelineKind(str, Enum):
    none = "none"
    nodegroup = "nodegroup"    # seed 004: node groups paired across jobs, CounterBarriers between


class PlanPeaks(str, Enum):
    """How the jobs planned together are assumed to overlap (the peak model)."""

    timeline = "timeline"      # their time-aligned footprints
    coincident = "coincident"  # the sum of their peaks (Note [Coincident peaks])
    paired = "paired"          # every floor plus the largest peak (Note [Paired peaks])

    @classmethod
    def for_pipeline(cls, pipeline: "PipelineKind") -> "PlanPeaks":
        """The default peak model: paired for the node-group pipeline, which staggers the jobs' peaks (Note [Paired
        peaks]); else coincident: free-running jobs keep no alignment (Note [Coincident peaks])."""
        return cls.paired if pipeline == PipelineKind.nodegroup else cls.coincident


class PlanOrder(str, Enum):
    """How a planned step runs its ops (Note [Free-order plans] in tensile_tf.scheduler.peak_analysis)."""

    plan = "plan"              # chained in plan order: peaks where predicted, no inter-op parallelism
    free = "free"              # on the executor's threads, planned with their observed concurrency
    auto = "auto"              # free when its plan meets the budget by swaps alone, else plan


class RunSpec(_Strict):
    concurrency: StrictInt | None = Field(None, ge=1, description="most jobs running at once")
    out_dir: StrictStr = "runs/latest"
    admission: Admission = Admission.salus
    planner: PlannerKind = Field(
        PlannerKind.none, description="tensile: plan swaps and recomputation for the jobs so they fit the pool together")
    swap_bandwidth: int | str | None = Field(None, description="planner: the emulated swap link, bytes per second "
        "(e.g. 2GiB) or a device link (h200-pcie5, h200-pcie5-bf16) (default: 12GiB, PCIe 3.0 x16: the emulated link runs at it and the planner plans for it)")
    link_lanes: Literal[1, 2] | None = Field(None, description="planner: the swap link's lanes, 1 (the seed's) or 2 "
        "(one per direction; tensile_tf/config/device_links.py) (default: 2 for a device link, else 1)")
    plan_budget: int | None = Field(
        None, description="planner: the pool bytes the jobs planned together may use at their combined peak, "
        "e.g. 80MiB (default: the pool less a 10% headroom)")
    plan_peaks: PlanPeaks | None = Field(
        None, description="planner: 'timeline' plans for the jobs' time-aligned footprints from their "
        "start_offset_s and predicted step times; 'coincident' for the sum of the jobs' peaks (the seed's "
        "MP = sum MP_j), as if every job peaked at once; 'paired' for every job's floor plus the "
        "largest peak, as the node-group pipeline staggers them (default: 'paired' with pipeline: nodegroup, "
        "else 'coincident': free-running jobs do not keep the offsets a time-aligned plan assumes)")
    plan_order: PlanOrder = Field(
        PlanOrder.plan, description="planner: 'plan' runs a planned step's ops one after another in plan order "
        "(the peak lands where predicted); 'free' leaves them to TensorFlow's inter-op threads and plans for "
        "the concurrency seen in the unplanned steps (faster where the model has parallel branches, e.g. "
        "Inception; the prediction is looser); 'auto' takes the free-order plan when it meets the budget "
        "by swaps alone, else plans in plan order")
    replan: StrictBool = Field(
        True, description="planner: re-plan the running jobs together while they run, when a job ends "
        "or its op latencies drift (Note [Re-planning on events]); false keeps each job's first plan")
    replan_switch: Literal["ready", "next_step"] = Field("ready", description="planner: a re-planned job takes its "
        "new step once instantiated ('ready'; on its old plan meanwhile) or at its next step, waiting there")
    plan_steps: Literal["rewrite", "table", "table_then_rewrite"] = Field(
        "table_then_rewrite", description="planner: 'table_then_rewrite' runs a re-plan the job's plan-table step "
        "carries from the job's next step, and on the plan's rewritten step once that is built in the background "
        "(Note [Table first, rewritten when ready]; with replan: false, as 'rewrite': nothing re-plans); 'rewrite' rewrites every plan and switches once the new step "
        "is instantiated (seconds); 'table' runs every plan that only swaps on a step rewritten once per job that "
        "reads its plan from a table (Note [Plans read at run time] in tf_plugin/swap/plan_table.h; each of its "
        "steps costs its chain and slots)")
    replan_threshold: StrictFloat = Field(
        0.2, gt=0, description="planner: re-plan when a job's EWMA-corrected op latencies summed differ from "
        "those of its plan by more than this share (seed 000 §IV-E's change rate)")
    pipeline: PipelineKind = PipelineKind.none
    split_size: int | Literal["auto"] = Field(
        "auto", description="node-group pipeline: net bytes (de)allocated per node group, e.g. 16MiB, "
        "or 'auto' (each job runs its step once alone with the barriers of several splits and keeps the one "
        "that peaked lowest; Note [Split size tuning] in tensile_tf/runtime/nodegroup.py)")
    barrier_timeout_s: StrictFloat = Field(60.0, gt=0, description="node-group pipeline: longest wait at a "
                                     "CounterBarrier before the step fails")
    allocation_wait_ms: StrictInt = Field(1000, ge=0, description="how long an op's allocation that does not fit "
                                          "waits for other jobs' frees before it is an OOM (0: never)")
    reuse_traced_steps: StrictBool = Field(True, description="no pipeline or saved plan: a job like an ended one but "
        "for name, seed, length, learning rate trains its traced step, planned as its own (Note [Reusing a finished "
        "job's traced step], Note [Reuse under a planner])")

    @field_validator("split_size", mode="before")
    @classmethod
    def _split_size(cls, v: Any) -> int | str:
        return v if v == "auto" else parse_bytes(v, what="split_size")

    @field_validator("swap_bandwidth", "plan_budget", mode="before")
    @classmethod
    def _optional_size(cls, v: Any, info: ValidationInfo) -> int | str | None:
        if info.field_name == "swap_bandwidth":   # bytes per second or a device link's name
            return parse_swap_link(v, "swap_bandwidth")
        return None if v is None else parse_bytes(v, what=info.field_name)


class RunConfig(_Strict):
    pool: int = Field(description="device pool capacity, e.g. 2GiB")
    run: RunSpec = Field(default_factory=RunSpec)
    jobs: list[JobSpec] = Field(min_length=1)

    @field_validator("pool", mode="before")
    @classmethod
    def _pool_size(cls, v: Any) -> int:
        return parse_bytes(v, what="pool")


# ----------------------------------------------------------- YAML locations

def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _clean_loc(loc: tuple) -> tuple:
    # pydantic inserts validator names ("function-after[...]") into some locations.
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


def _locate(marks: dict[tuple, yaml.Mark], loc: tuple) -> yaml.Mark | None:
    loc = tuple(loc)
    while loc:
        if loc in marks:
            return marks[loc]
        loc = loc[:-1]
    return marks.get(())


def format_location(source: str, marks: dict | None, loc: tuple, message: str) -> str:
    """``file:line:col: path: message`` for the key path ``loc``."""
    mark = _locate(marks or {}, tuple(loc))
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    return f"{where}: {_format_loc(tuple(loc))}: {message}"


_YAML_BOOLEANS = "yes/no, on/off and true/false"


def _error_message(err: dict[str, Any]) -> str:
    """pydantic's message for one error, with what to do."""
    kind, given = err["type"], err.get("input")
    msg = err["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return "unknown key; check its spelling and indentation"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "string_type" and isinstance(given, bool):
        return f"expected text, but YAML read {given!r} as a boolean ({_YAML_BOOLEANS} are booleans); quote it"
    if kind in ("int_type", "float_type") and isinstance(given, str):
        return f"expected a number, got the text {given!r}; write it without quotes"
    if kind == "int_type" and isinstance(given, float):
        return f"expected a whole number, got {given!r}; write it without a decimal point"
    if kind == "bool_type":
        return f"expected true or false, got {given!r}"
    if kind == "enum":
        return msg.replace("Input should be", "expected")
    if kind.endswith("_type") or kind in ("greater_than", "greater_than_equal", "less_than_equal", "string_too_short",
                                          "string_pattern_mismatch", "too_short"):
        return msg.replace("Input should be", "expected") + f" (got {given!r})"
    return msg


def config_from_data(data: Any, *, source: str = "<config>", marks: dict | None = None) -> RunConfig:
    """Validates already-parsed YAML/JSON data."""
    if data is None:
        raise ConfigError(f"{source}: the file is empty; a config needs `pool:` and `jobs:` "
                          "(see configs/quickstart.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1:1: the top level must be a mapping with `pool:` and `jobs:`, "
                          f"not a {type(data).__name__} (see configs/quickstart.yaml)")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        lines = [format_location(source, marks, _clean_loc(err["loc"]), _error_message(err)) for err in e.errors()]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def read_yaml(path: str | Path) -> tuple[Any, dict[tuple, yaml.Mark]]:
    """The parsed YAML file and the location of every key path in it;
    ConfigError when it cannot be read or parsed."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; name the YAML file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the configuration ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(f"{path}:{line}:{column}: the file is not UTF-8 text (byte 0x{raw[e.start]:02x}); "
                          "save it as UTF-8") from None
    try:
        data, twice = parse_data(text)           # Note [Marks only for errors] in config/yaml_nodes.py
        node = parse_tree(text) if twice else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        tabs = "'\\t'" in problem or "tab" in problem or "\t" in line[:mark.column + 1 if mark else 0]
        hint = "; YAML indents with spaces, never tabs" if tabs else \
            "; check the indentation and the brackets or quotes on this line"
        raise ConfigError(f"{where}: not valid YAML: {problem}{hint}") from None
    duplicates = duplicate_keys(node) if node is not None else []
    if duplicates:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(
            f"{path}:{mark.line + 1}:{mark.column + 1}: {_format_loc(loc)}: the key appears twice in one mapping "
            f"(first on line {first.line + 1}); YAML would keep only the last: remove one"
            for loc, mark, first in duplicates))
    return data, LazyMarks(text)


def load_config(path: str | Path) -> RunConfig:
    """Reads and validates a YAML run configuration; ConfigError says what and where."""
    data, marks = read_yaml(path)
    return config_from_data(data, source=str(path), marks=marks)
