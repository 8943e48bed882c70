"""The YAML search configuration: ``pool`` and ``run`` as for ``tensile run``,
and a ``search:`` section instead of ``jobs:``::

    pool: 1GiB
    run: {out_dir: runs/search}
    search:
      study_name: quickstart
      sampler: {name: tpe, seed: 0}      # grid | random | tpe (or just `sampler: random`)
      n_trials: 12                        # grid: defaults to the grid's size
      max_concurrent: 4                   # most trials at once (admission may allow fewer)
      admit_by_cores: true                # no trial starts beside others while they keep the cores busy
      objective: {metric: final_loss, direction: minimize}
      pruning: {enabled: true, n_startup_trials: 3, n_warmup_steps: 20, interval_steps: 10}
      base_job:                           # a job spec (name optional): what every trial starts from
        model: {builder: "tensile_tf.jobs.zoo:mlp", args: {hidden: [64]}}
        input_shape: [64]
        steps: 200
      space:                              # dotted paths into the job spec, in Optuna's terms
        batch_size: {type: int, low: 16, high: 256, log: true}
        optimizer.learning_rate: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
        model.args.hidden: {type: categorical, choices: [[64], [128, 64]]}

Unknown keys are rejected; errors name file:line:column like the run
configuration's (the location helpers are tensile_tf.config.schema's). Every
parameter is checked against the job schema at its extremes (low, high and
every choice), so a path that names no job field, or a range the job schema
refuses, fails here and not in trial 7.
"""
from __future__ import annotations

import copy
import json
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tensile_tf.config.schema import (
    ConfigError,
    JobSpec,
    RunSpec,
    _clean_loc,
    _format_loc,
    _locate,
    read_yaml,
)
from tensile_tf.units import parse_bytes

# A grid of more points than this is almost surely a mistake (an int range
# without a step, say); say so instead of queueing a million trials.
MAX_GRID_POINTS = 10_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ------------------------------------------------------------------ the space

class FloatParam(_Strict):
    """optuna.distributions.FloatDistribution."""

    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "FloatParam":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.log and self.step is not None:
            raise ValueError("give 'log' or 'step', not both (Optuna cannot sample a stepped log range)")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (got {self.low})")
        return self

    def distribution(self):
        import optuna

        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def grid(self) -> list:
        if self.step is None:
            raise ValueError("grid search needs a finite set: give this float a 'step', "
                             "or make it categorical with 'choices'")
        n = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return [round(self.low + i * self.step, 12) for i in range(n)]

    def extremes(self) -> list:
        return [self.low, self.high]


class IntParam(_Strict):
    """optuna.distributions.IntDistribution."""

    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "IntParam":
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.log and self.step != 1:
            raise ValueError("give 'log' or 'step', not both (Optuna cannot sample a stepped log range)")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (got {self.low})")
        return self

    def distribution(self):
        import optuna

        return optuna.distributions.IntDistribution(self.low, self.high, log=self.log, step=self.step)

    def grid(self) -> list:
        if self.log:
            raise ValueError("grid search over a log int range would try every integer in it; "
                             "make it categorical, e.g. choices: [16, 32, 64, 128]")
        return list(range(self.low, self.high + 1, self.step))

    def extremes(self) -> list:
        return [self.low, self.high]


_SCALAR = (type(None), bool, int, float, str)


class CategoricalParam(_Strict):
    """optuna.distributions.CategoricalDistribution. Choices that are lists or
    mappings (e.g. layer widths [128, 64]) are stored in the study as their
    JSON text, since Optuna persists only scalars; trials get them decoded."""

    type: Literal["categorical"]
    choices: list[Any] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, v: list) -> list:
        keys = [json.dumps(c, sort_keys=True) for c in v]
        if len(set(keys)) != len(keys):
            raise ValueError("choices must be distinct")
        return v

    @property
    def encoded(self) -> bool:
        return not all(isinstance(c, _SCALAR) for c in self.choices)

    def optuna_choices(self) -> list:
        return [json.dumps(c) for c in self.choices] if self.encoded else list(self.choices)

    def distribution(self):
        import optuna

        return optuna.distributions.CategoricalDistribution(self.optuna_choices())

    def grid(self) -> list:
        return self.optuna_choices()

    def extremes(self) -> list:
        return list(self.choices)

    def decode(self, value: Any) -> Any:
        return json.loads(value) if self.encoded and isinstance(value, str) else value


ParamSpec = Annotated[Union[FloatParam, IntParam, CategoricalParam], Field(discriminator="type")]


# ---------------------------------------------------------- search settings

class SamplerName(str, Enum):
    grid = "grid"
    random = "random"
    tpe = "tpe"


class SamplerSpec(_Strict):
    name: SamplerName = SamplerName.tpe
    seed: int | None = Field(None, description="fixes the draws of a fresh single-process search")
    n_startup_trials: int = Field(10, ge=0, description="tpe: random trials before TPE takes over")


class Metric(str, Enum):
    final_loss = "final_loss"        # mean loss of the last 10 steps (one batch's loss is noisy)
    last_loss = "last_loss"          # the last step's loss
    best_loss = "best_loss"          # the lowest step loss
    mean_loss = "mean_loss"          # mean over all steps (area under the curve)
    examples_per_second = "examples_per_second"  # batch_size / median step time
    val_loss = "val_loss"            # the last validation's loss (data.validation_split)
    val_accuracy = "val_accuracy"    # the last validation's accuracy (metrics: [accuracy])


# Metrics a larger value of which is better: their direction must be maximize.
HIGHER_IS_BETTER = {Metric.examples_per_second, Metric.val_accuracy}


class ObjectiveSpec(_Strict):
    """What a trial is judged by. Without ``metric``: ``val_loss`` when the
    base job holds out validation examples, else ``final_loss``. Without
    ``direction``: maximize for accuracy and throughput, else minimize."""

    metric: Metric | None = None
    direction: Literal["minimize", "maximize"] | None = None


class PruningSpec(_Strict):
    """Optuna's MedianPruner on the objective metric, reported every
    ``interval_steps`` steps: a trial stops when its value is worse than the
    median of completed trials' values at the same step."""

    enabled: bool = False
    n_startup_trials: int = Field(5, ge=0, description="completed trials before any pruning")
    n_warmup_steps: int = Field(0, ge=0, description="steps of each trial never pruned")
    interval_steps: int = Field(10, ge=1, description="report (and check) every this many steps")


class BaseJobSpec(JobSpec):
    """A JobSpec whose name is optional: trials are named NAME-NUMBER."""

    name: str = Field("trial", min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")


class SearchSpec(_Strict):
    study_name: str = Field("search", min_length=1)
    base_job: BaseJobSpec
    space: dict[str, ParamSpec] = Field(min_length=1)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    n_trials: int | None = Field(None, ge=1, description="total trials in the study; grid: the grid's size")
    max_concurrent: int | None = Field(None, ge=1, description="most trials running at once in this process")
    admit_by_cores: bool = Field(True, description="start no trial beside running ones while they keep the cores "
                                 "busy (Note [Admitting by the cores] in tensile_tf/runtime/core_meter.py)")
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    pruning: PruningSpec = Field(default_factory=PruningSpec)

    @field_validator("sampler", mode="before")
    @classmethod
    def _sampler_shorthand(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _objective(self) -> "SearchSpec":
        """Resolves the objective's defaults (ObjectiveSpec) against the base job."""
        held_out = self.base_job.data.has_validation
        metric = self.objective.metric or (Metric.val_loss if held_out else Metric.final_loss)
        direction = self.objective.direction or ("maximize" if metric in HIGHER_IS_BETTER else "minimize")
        if metric.value.startswith("val_") and not held_out:
            raise ValueError(f"objective {metric.value} needs validation examples: set base_job.data.validation_split "
                             "(e.g. 0.2, with data kind npz, npy, tfrecord, image_dir or digits) or "
                             "base_job.data.validation_path")
        if metric == Metric.val_accuracy and "accuracy" not in self.base_job.metrics:
            raise ValueError("objective val_accuracy needs 'accuracy' in base_job.metrics")
        if (metric in HIGHER_IS_BETTER) != (direction == "maximize"):
            raise ValueError(f"objective {metric.value} with direction {direction}: "
                             f"{'higher' if metric in HIGHER_IS_BETTER else 'lower'} is better, so use "
                             f"direction: {'maximize' if metric in HIGHER_IS_BETTER else 'minimize'}")
        object.__setattr__(self, "objective", ObjectiveSpec(metric=metric, direction=direction))
        return self

    @property
    def total_trials(self) -> int:
        return self.n_trials if self.n_trials is not None else grid_size(self.space)


class SearchConfig(_Strict):
    pool: int = Field(description="device pool capacity, e.g. 2GiB")
    run: RunSpec = Field(default_factory=RunSpec)
    search: SearchSpec

    @field_validator("pool", mode="before")
    @classmethod
    def _pool_size(cls, v: Any) -> int:
        return parse_bytes(v, what="pool")


# ------------------------------------------------------ params -> job spec

def grid_search_space(space: dict[str, ParamSpec]) -> dict[str, list]:
    """The optuna GridSampler search space (values as stored in the study)."""
    out = {}
    for name, param in space.items():
        try:
            out[name] = param.grid()
        except ValueError as e:
            raise ValueError(f"space.{name}: {e}") from None
    return out


def grid_size(space: dict[str, ParamSpec]) -> int:
    size = math.prod(len(v) for v in grid_search_space(space).values())
    if size > MAX_GRID_POINTS:
        raise ValueError(f"the grid has {size} points (more than {MAX_GRID_POINTS}); coarsen the steps "
                         "or use sampler: random or tpe")
    return size


def set_path(data: dict, path: str, value: Any) -> None:
    """data[a][b][c] = value for path 'a.b.c', creating mappings on the way
    (so model.args.filters works when the base job has no args yet)."""
    parts = path.split(".")
    node = data
    for i, key in enumerate(parts[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{'.'.join(parts[:i + 1])} is a {type(child).__name__}, not a mapping, "
                             f"so {path!r} cannot be set")
        node = child
    node[parts[-1]] = value


def decode_params(space: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """Optuna's stored values -> the values the job gets (JSON choices decoded)."""
    return {k: space[k].decode(v) if isinstance(space.get(k), CategoricalParam) else v
            for k, v in params.items()}


def trial_job_spec(base_job: JobSpec | dict, params: dict[str, Any], name: str) -> JobSpec:
    """The job one trial runs: base_job with each dotted param set. Raises
    pydantic's ValidationError when the result is not a valid job."""
    data = base_job.model_dump() if isinstance(base_job, BaseModel) else copy.deepcopy(dict(base_job))
    for path, value in params.items():
        set_path(data, path, value)
    data["name"] = name
    return JobSpec.model_validate(data)


def _check_search(cfg: SearchSpec) -> list[tuple[tuple, str]]:
    """(location, message) for what the schema alone cannot see: sampler
    needs, and params whose extreme values make no valid job."""
    problems = []
    if cfg.sampler.name == SamplerName.grid:
        for name, param in cfg.space.items():
            try:
                param.grid()
            except ValueError as e:
                problems.append((("search", "space", name), str(e)))
        if not problems:
            try:
                size = grid_size(cfg.space)
            except ValueError as e:
                problems.append((("search", "space"), str(e)))
            else:
                if cfg.n_trials is not None and cfg.n_trials > size:
                    problems.append((("search", "n_trials"), f"n_trials ({cfg.n_trials}) exceeds the grid's "
                                     f"{size} points; leave n_trials out to run the whole grid once"))
    elif cfg.n_trials is None:
        problems.append((("search", "sampler"), f"sampler {cfg.sampler.name.value!r} needs n_trials "
                         "(how many trials in all)"))
    for name, param in cfg.space.items():
        for value in param.extremes():
            try:
                trial_job_spec(cfg.base_job, {name: value}, "check")
            except ValueError as e:  # ValidationError is a ValueError
                if isinstance(e, ValidationError):
                    first = e.errors()[0]
                    detail = f"{_format_loc(_clean_loc(first['loc']))}: {first['msg']}"
                    if first["type"] == "extra_forbidden":
                        detail = f"{_format_loc(_clean_loc(first['loc']))}: the job spec has no such key"
                else:
                    detail = str(e)
                problems.append((("search", "space", name),
                                 f"value {value!r} makes an invalid job ({detail.removeprefix('Value error, ')})"))
                break
    return problems


# ------------------------------------------------------------- loading

def _located(marks: dict, source: str, loc: tuple, msg: str) -> str:
    mark = _locate(marks or {}, loc)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    return f"{where}: {_format_loc(loc)}: {msg}"


_TAGS = ("float", "int", "categorical")


def _strip_union_tag(loc: tuple) -> tuple:
    # pydantic names the union member in locations: search.space.lr.float.low
    if loc[:2] == ("search", "space") and len(loc) > 3 and loc[3] in _TAGS:
        return loc[:3] + loc[4:]
    return loc


def search_config_from_data(data: Any, *, source: str = "<config>", marks: dict | None = None) -> SearchConfig:
    """Validates parsed YAML; ConfigError lists every problem with its location."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with 'pool', 'run' and 'search'")
    if "jobs" in data and "search" not in data:
        raise ConfigError(f"{source}: this is a run configuration ('jobs:'); a search needs a 'search:' "
                          "section with base_job and space (run it with `tensile run`)")
    try:
        cfg = SearchConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = _strip_union_tag(_clean_loc(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key; check its spelling and indentation"
            elif err["type"] == "missing":
                msg = "required key is missing"
            elif err["type"] == "union_tag_invalid" or err["type"] == "union_tag_not_found":
                msg = "give 'type: float', 'type: int' or 'type: categorical'"
            lines.append(_located(marks, source, loc, msg))
        raise ConfigError("invalid search configuration:\n  " + "\n  ".join(lines)) from None
    problems = _check_search(cfg.search)
    if problems:
        raise ConfigError("invalid search configuration:\n  " + "\n  ".join(
            _located(marks, source, loc, msg) for loc, msg in problems))
    return cfg


def load_search_config(path: str | Path) -> SearchConfig:
    """Reads and validates a YAML search configuration."""
    data, marks = read_yaml(path)
    return search_config_from_data(data, source=str(path), marks=marks)
