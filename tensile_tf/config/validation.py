"""What ``tensile validate`` checks beyond the schema, before anything trains.

``load_config`` (tensile_tf.config.schema) checks the YAML and the schema: types
(strict: no silent coercions), ranges, unknown and duplicate keys.
``check_config`` then checks what the schema cannot see, everything that can
be checked without training:

1. **References resolve**: each ``builder``, ``train_step_factory`` and data
   ``function`` imports and is callable; each ``keras.applications`` name
   exists; each optimizer and loss name is one Keras knows (the optimizer is
   built once with its ``args``); each ``args`` key is a keyword the function
   takes, and each argument it requires is given.
2. **Sizes against the machine**: the pool is host memory here (it emulates
   the device), so it must fit in this machine's memory; a job's synthetic
   input batch must fit in the memory the machine has free.
3. **Sizes against the pool**: a job's synthetic input batches live in the
   pool for the whole run, so they must fit in it, with room to train;
   ``run.plan_budget`` and ``run.split_size`` must be smaller than the pool.

``tensile run`` and ``tensile search`` run the same checks first, so a
config that fails minutes later fails here instead. Each problem reads
``file:line:col: path: what is wrong; what to do``. Lookups are cached by
reference, so a config of many jobs sharing a model validates in the time
of one.

Reference checks (1) import the user's modules and Keras: call them after
``tensile_tf.install`` (building an optimizer creates TensorFlow variables,
which must land in the pool).
"""
from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tensile_tf.config.schema import FILE_KINDS, ConfigError, JobSpec, RunConfig, format_location
from tensile_tf.units import human_bytes

FLOAT32_BYTES = 4
LABEL_BYTES = 4   # int32 class labels


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where (a key path), what, what to do."""

    loc: tuple
    what: str
    todo: str

    def message(self) -> str:
        return f"{self.what}; {self.todo}"


# ------------------------------------------------------------- the machine

def machine_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory_bytes() -> int:
    """Memory the kernel can give this process now (MemAvailable), or the
    physical memory where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return machine_memory_bytes()


def synthetic_batch_bytes(spec: JobSpec, input_shape: tuple[int, ...]) -> int:
    """Bytes of one synthetic (x, y) batch: float32 inputs, int32 labels."""
    return spec.batch_size * (math.prod(input_shape) * FLOAT32_BYTES + LABEL_BYTES)


def host_batch_problem(spec: JobSpec, input_shape: tuple[int, ...], loc: tuple = ("batch_size",)) -> Problem | None:
    """The job's synthetic input batch is made in host memory first: it must
    fit in what the machine has free (with the same again for the copy)."""
    batch = synthetic_batch_bytes(spec, input_shape)
    if 2 * batch <= machine_memory_bytes():
        return None      # fits even the whole machine: no need to read what is free (a 50,000-job config)
    free = available_memory_bytes()
    if 2 * batch <= free:
        return None
    return Problem(loc, f"one synthetic input batch of {spec.batch_size} x {list(input_shape)} float32 takes "
                   f"{human_bytes(batch)}; making it needs twice that in host memory and this machine has "
                   f"{human_bytes(free)} free", "lower `batch_size:` or the `input_shape:`")


# ------------------------------------------------------------- references

@functools.lru_cache(maxsize=None)
def _resolve(ref: str) -> tuple[Callable | None, str, str]:
    """'module:function' -> (function, what is wrong, what to do)."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (e.name == module_name or module_name.startswith(e.name + ".")):
            return None, f"there is no module {module_name!r}", \
                "check its spelling, and run from the folder that holds it (or add that folder to PYTHONPATH)"
        return None, f"module {module_name!r} does not import: it needs {e.name!r}, which is not installed", \
            f"install {e.name!r}"
    except Exception as e:  # noqa: BLE001 - any error the user's module raises at import
        return None, f"module {module_name!r} does not import ({type(e).__name__}: {e})", \
            "fix the module (`python -c 'import " + module_name + "'` shows the traceback)"
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else \
            f"it has: {', '.join(names[:12]) or 'no functions'}"
        return None, f"module {module_name!r} has no function {attr!r}", hint
    return fn, "", ""


def _signature(fn: Callable) -> inspect.Signature | None:
    """``fn``'s signature, once per function (every job of a large config names the same builder)."""
    try:
        return _cached_signature(fn)
    except TypeError:    # an unhashable callable: not cached
        return _signature_of(fn)


@functools.lru_cache(maxsize=256)
def _cached_signature(fn: Callable) -> inspect.Signature | None:
    return _signature_of(fn)


def _signature_of(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None   # a builtin without a signature: nothing to check


def argument_problems(fn: Callable, args: dict[str, Any], offered: set[str], loc: tuple, what: str) -> list[Problem]:
    """``args`` against ``fn``'s signature: every key a keyword it takes, and
    every argument it requires given (by ``args`` or by the runtime: ``offered``)."""
    sig = _signature(fn)
    if sig is None:
        return []
    params = sig.parameters
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
    keywords = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    problems = []
    if not takes_kwargs:
        for key in args:
            if key not in keywords:
                close = difflib.get_close_matches(key, keywords, n=1)
                problems.append(Problem(loc + ("args", key), f"{what} takes no argument {key!r}",
                                        f"did you mean {close[0]!r}?" if close else
                                        f"it takes: {', '.join(keywords) or 'no keyword arguments'}"))
    for name, p in params.items():
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) \
                and name not in args and name not in offered:
            problems.append(Problem(loc + ("args",), f"{what} requires argument {name!r}, which is not given",
                                    f"add `{name}:` under `args:`"))
    return problems


def _reference_problems(ref: str, args: dict[str, Any], offered: set[str], loc: tuple, key: str) -> list[Problem]:
    fn, what, todo = _resolve(ref)
    if fn is None:
        return [Problem(loc + (key,), f"{key} {ref!r}: {what}", todo)]
    return argument_problems(fn, args, offered, loc, f"{key} {ref!r}")


@functools.lru_cache(maxsize=None)
def _keras_names(kind: str) -> tuple[str, ...]:
    import keras

    module = getattr(keras, kind)
    return tuple(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))


def _application_problems(spec: JobSpec, loc: tuple) -> list[Problem]:
    import keras

    name = spec.model.application
    app = getattr(keras.applications, name, None)
    if app is None or not callable(app):
        close = difflib.get_close_matches(name, _keras_names("applications"), n=3)
        return [Problem(loc + ("application",), f"keras.applications has no model {name!r}",
                        f"did you mean {', '.join(close)}?" if close else
                        "see keras.applications for the names (ResNet50, MobileNetV2, ...)")]
    return argument_problems(app, spec.model.args, {"weights", "input_shape", "classes"}, loc,
                             f"keras.applications.{name}")


@functools.lru_cache(maxsize=None)
def _optimizer_problem(name: str, learning_rate: float, args_json: str) -> tuple[str, str, str] | None:
    """(which key, what, todo), or None if Keras builds this optimizer
    (``args_json``: its args as sorted JSON, a cache key even for list values)."""
    import keras

    try:
        keras.optimizers.get({"class_name": name, "config": {"learning_rate": learning_rate}})
    except (ValueError, TypeError):
        known = sorted({n.lower() for n in _keras_names("optimizers")} - {"get", "serialize", "deserialize",
                                                                           "optimizer", "schedules"})
        close = difflib.get_close_matches(name.lower(), known, n=3)
        return "name", f"Keras knows no optimizer {name!r}", \
            (f"did you mean {', '.join(close)}?" if close else f"use one of: {', '.join(known)}")
    try:
        keras.optimizers.get({"class_name": name, "config": {"learning_rate": learning_rate, **json.loads(args_json)}})
    except (ValueError, TypeError) as e:
        return "args", f"optimizer {name!r} does not accept these args ({e})", \
            "fix or remove the keys under `optimizer.args:`"
    return None


@functools.lru_cache(maxsize=None)
def _loss_problem(name: str) -> tuple[str, str] | None:
    import keras

    try:
        keras.losses.get(name)
    except (ValueError, TypeError):
        known = sorted(n for n in _keras_names("losses") if n.islower() and n not in ("get", "serialize",
                                                                                       "deserialize"))
        close = difflib.get_close_matches(name, known, n=3)
        return f"Keras knows no loss {name!r}", (f"did you mean {', '.join(close)}?" if close else
                                                 "use a name from keras.losses, e.g. sparse_categorical_crossentropy")
    return None


def reference_problems(spec: JobSpec, loc: tuple, *, searched: set[str] = frozenset()) -> list[Problem]:
    """Check 1 (module docstring) for one job. ``searched``: the dotted keys a
    search sets in each trial (``model.args.width``): an argument the space
    gives counts as given."""
    m = spec.model
    from_space = {key.removeprefix("model.args.") for key in searched if key.startswith("model.args.")}
    problems: list[Problem] = []
    if m.train_step_factory:
        problems += _reference_problems(m.train_step_factory, m.args | dict.fromkeys(from_space),
                                        {"input_shape", "classes", "batch_size", "seed"}, loc + ("model",),
                                        "train_step_factory")
        return problems   # the factory makes its own optimizer, loss and data
    if m.keras_file:
        if not Path(m.keras_file).is_file():
            problems.append(Problem(loc + ("model", "keras_file"), f"{m.keras_file!r} does not exist",
                                    "save it with model.save('NAME.keras') and give its path "
                                    "(relative paths start where tensile runs)"))
    elif m.application:
        problems += _application_problems(spec, loc + ("model",))
    else:
        problems += _reference_problems(m.builder, m.args | dict.fromkeys(from_space), {"input_shape", "classes"},
                                        loc + ("model",), "builder")
    opt = spec.optimizer
    found = _optimizer_problem(opt.name, opt.learning_rate, json.dumps(opt.args, sort_keys=True, default=str))
    if found is not None:
        key, what, todo = found
        problems.append(Problem(loc + ("optimizer", key), what, todo))
    found_loss = _loss_problem(spec.loss)
    if found_loss is not None:
        problems.append(Problem(loc + ("loss",), *found_loss))
    if spec.data.kind == "function":
        problems += _reference_problems(spec.data.function, spec.data.args, {"batch_size", "seed"},
                                        loc + ("data",), "function")
    for key in ("path", "labels_path", "validation_path", "validation_labels_path"):
        value = getattr(spec.data, key)
        if spec.data.kind in FILE_KINDS and value and not _data_path_exists(spec.data.kind, value):
            what = "a NumPy file" if spec.data.kind in ("npz", "npy") else FILE_KINDS[spec.data.kind]
            problems.append(Problem(loc + ("data", key), f"{value!r} does not exist",
                                    f"give the path of {what} (relative paths start where tensile runs)"))
    return problems


def _data_path_exists(kind: str, value: str) -> bool:
    if kind == "tfrecord":
        import glob

        return bool(glob.glob(str(Path(value).expanduser())))
    return Path(value).expanduser().exists()


# ------------------------------------------------------------------ sizes

def size_problems(cfg: RunConfig) -> list[Problem]:
    """Checks 2 and 3 (module docstring)."""
    problems = machine_problems(cfg.pool)
    run = cfg.run
    if run.plan_budget is not None and run.plan_budget > cfg.pool:
        problems.append(Problem(("run", "plan_budget"), f"the plan budget ({human_bytes(run.plan_budget)}) is larger "
                                f"than the pool ({human_bytes(cfg.pool)})", "lower it below `pool:`, or leave it out"))
    if isinstance(run.split_size, int) and run.split_size >= cfg.pool:
        problems.append(Problem(("run", "split_size"), f"node groups of {human_bytes(run.split_size)} are as large "
                                f"as the pool ({human_bytes(cfg.pool)})", "use a few MiB, or 'auto'"))
    for i, spec in enumerate(cfg.jobs):
        loc = ("jobs", i)
        if spec.input_shape is not None and any(d < 1 for d in spec.input_shape):
            problems.append(Problem(loc + ("input_shape",), f"{list(spec.input_shape)} has a dimension below 1",
                                    "give every dimension as a positive number, e.g. [32, 32, 3]"))
            continue
        if spec.data.kind != "synthetic" or spec.input_shape is None or spec.model.train_step_factory:
            continue  # the job's own data: its size shows when it is built
        batch = synthetic_batch_bytes(spec, spec.input_shape)
        on_device = spec.data.device_batches   # Note [Input data on the host] in jobs.py
        held = batch * on_device
        if held > cfg.pool:
            shape = f"{spec.batch_size} x {list(spec.input_shape)} float32"
            what = (f"the job's input batch and the prefetched next one take {human_bytes(held)} of the pool "
                    f"({human_bytes(batch)} each: {shape})" if on_device > 1 else
                    f"the job's input batch takes {human_bytes(held)} of the pool ({shape})")
            problems.append(Problem(loc + ("batch_size",), f"{what}, more than the whole pool ({human_bytes(cfg.pool)})",
                                    "lower `batch_size:` or raise `pool:`"
                                    + (", or drop `data.prefetch:`" if on_device > 1 else "")))
            continue
        host = host_batch_problem(spec, spec.input_shape, loc + ("batch_size",))
        if host is not None:
            problems.append(host)
    return problems


def name_problems(cfg: RunConfig) -> list[Problem]:
    """Job names are unique: they name the jobs' pool streams and outputs."""
    first: dict[str, int] = {}
    problems = []
    for i, spec in enumerate(cfg.jobs):
        if spec.name in first:
            problems.append(Problem(("jobs", i, "name"), f"job name {spec.name!r} is used twice (first by "
                                    f"jobs[{first[spec.name]}]); job names must be unique", "rename one"))
        first.setdefault(spec.name, i)
    return problems


def machine_problems(pool: int) -> list[Problem]:
    """The pool against this machine's memory (check 2)."""
    total = machine_memory_bytes()
    if pool <= total:
        return []
    return [Problem(("pool",), f"the pool ({human_bytes(pool)}) is larger than this machine's memory "
                    f"({human_bytes(total)}); the pool is host memory here (it emulates the device)", "lower `pool:`")]


def config_reference_problems(cfg: RunConfig) -> list[Problem]:
    """Check 1 for every job of a config."""
    return [p for i, spec in enumerate(cfg.jobs) for p in reference_problems(spec, ("jobs", i))]


def check_config(cfg: RunConfig, *, references: bool = True) -> list[Problem]:
    """Every problem ``tensile validate`` finds in a schema-valid config."""
    problems = name_problems(cfg) + size_problems(cfg)
    return problems + config_reference_problems(cfg) if references else problems


def check_search(scfg, *, references: bool = True) -> list[Problem]:
    """What ``check_config`` checks, for a search config: the pool against
    the machine, and the base job's references with the searched keys given."""
    problems = machine_problems(scfg.pool)
    if references:
        problems += reference_problems(scfg.search.base_job, ("search", "base_job"), searched=set(scfg.search.space))
    return problems


def raise_problems(problems: list[Problem], *, source: str, marks: dict | None) -> None:
    """ConfigError listing every problem as ``file:line:col: path: what; todo``."""
    if problems:
        lines = [format_location(source, marks, p.loc, p.message()) for p in problems]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
