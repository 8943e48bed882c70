"""What every command shares: the user's mistakes (``UserError``: what, where,
what to do; exit 2, no traceback), the config loaded with the checks that need
no runtime, the references checked once the runtime is installed, and the
output folder checked before anything trains."""
from __future__ import annotations

from pathlib import Path


def is_search_config(path: str) -> bool:
    """A config with a top-level ``search:`` section and no ``jobs:`` (for ``tensile search``).
    Read from the top-level keys of a block mapping (column 0), without parsing the file, which
    ``load_checked`` parses once; other layouts (a flow mapping) are parsed here."""
    import re

    import yaml

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return False  # load_config reports it with its location
    top = set(re.findall(r"^([A-Za-z_]+)[ \t]*:", text, flags=re.MULTILINE))
    if top:
        return "search" in top and "jobs" not in top
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "search" in data and "jobs" not in data


class UserError(Exception):
    """A mistake in what the user asked for (config, arguments, paths): the
    command says what and where and exits 2, without a traceback."""


def load_checked(path: str):
    """The config after the checks that need no runtime (YAML, schema,
    names, sizes), and its key locations; UserError if any fails."""
    from tensile_tf.config.schema import ConfigError, config_from_data, read_yaml
    from tensile_tf.config.validation import check_config, raise_problems

    try:
        data, marks = read_yaml(path)
        cfg = config_from_data(data, source=path, marks=marks)
        raise_problems(check_config(cfg, references=False), source=path, marks=marks)
    except ConfigError as e:
        raise UserError(str(e)) from None
    return cfg, marks


def check_references(cfg, path: str, marks, *, install_pool: bool = True) -> None:
    """The modules, names and arguments the config refers to (they import
    Keras, so the runtime is installed first: with the config's pool when
    ``install_pool``, else with whatever pool the process has, for
    validating, which trains nothing)."""
    from tensile_tf.config.schema import ConfigError
    from tensile_tf.config.validation import config_reference_problems, raise_problems

    install_runtime(cfg.pool if install_pool else None)
    try:
        raise_problems(config_reference_problems(cfg), source=path, marks=marks)
    except ConfigError as e:
        raise UserError(str(e)) from None


def install_runtime(pool: int | None) -> None:
    """The runtime with the config's pool (None: the process's), before any
    TensorFlow op; a machine or environment that cannot host it (e.g.
    TF_CPU_ALLOCATOR_USE_BFC set) is the user's to fix."""
    import tensile_tf
    from tf_plugin._loader import PluginLoadError

    try:
        tensile_tf.install(pool)
        from tensile_tf.tf.pool import create_devices

        create_devices()   # now, with the GPU probe's messages kept off the console
    except PluginLoadError as e:
        raise UserError(str(e)) from None
    except (ValueError, RuntimeError) as e:  # TENSILE_POOL_BYTES unreadable; a pool of another size exists
        raise UserError(str(e)) from None


def check_output_dir(out: Path, what: str = "--out") -> Path:
    """Makes sure results can be written to ``out`` before anything trains."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{what} {out}: is a file, not a folder; name a folder for the results")
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".tensile-write-check-"):
            pass   # a name of its own: workers sharing one folder do not race
    except OSError as e:
        raise UserError(f"{what} {out}: cannot write there ({e.strerror}); name a folder you can write to") from None
    return out


def schema_version() -> int:
    from tensile_tf.runtime.records import SCHEMA_VERSION

    return SCHEMA_VERSION
