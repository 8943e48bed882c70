"""The planner, the node-group partition and pairing, the config schema and
this tier are pure: they import nothing of TensorFlow, Keras, the plugin
library or the runtime, at any depth (a function's local import counts).

Three checks: the source of every pure module, read as Python (``ast``);
a fresh interpreter that imports the pure packages with TensorFlow made
unimportable (the finder of conftest.py); and the tier itself, which runs
with that finder in place (conftest.py), so a test that reached TensorFlow
would fail."""
import ast
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT
from tests.scheduler.conftest import NoTensorFlow

# Modules read at any depth. tensile_tf/config/validation.py is not here: it
# imports keras inside functions, to check model names.
CHECKED_FILES = sorted([
    *(REPO_ROOT / "tensile_tf" / "scheduler").glob("*.py"),
    REPO_ROOT / "tensile_tf" / "config" / "__init__.py",
    REPO_ROOT / "tensile_tf" / "config" / "schema.py",
    REPO_ROOT / "tensile_tf" / "config" / "device_links.py",
    REPO_ROOT / "tensile_tf" / "config" / "yaml_nodes.py",
    REPO_ROOT / "tensile_tf" / "units.py",
    REPO_ROOT / "tf_plugin" / "nodegroup" / "partition.py",
    REPO_ROOT / "tf_plugin" / "nodegroup" / "schedule.py",
    *(REPO_ROOT / "tests" / "scheduler").glob("*.py"),
])
FORBIDDEN_PACKAGES = {"tensorflow", "keras", "tf_keras"}
PROJECT_PACKAGES = {"tensile_tf", "tf_plugin", "tests"}
# Packages whose import is pure but whose functions or lazy attributes (PEP
# 562) load TensorFlow: ``import`` them, or a pure submodule of them, but
# take no other name from them.
LAZY_PACKAGES = {"tensile_tf", "tf_plugin", "tf_plugin.nodegroup"}
# Pure to import, not read here: the tier imports them under the blocker.
PURE_AT_IMPORT = {"tests", "tests.conftest", "tests.scheduler"}
THREAD_MODULES = {"threading", "_thread", "concurrent", "multiprocessing"}


def module_name(path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


CHECKED = {module_name(p): p for p in CHECKED_FILES}


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of this repository (source or compiled)."""
    path = REPO_ROOT.joinpath(*name.split("."))
    return (path.with_suffix(".py").exists() or (path / "__init__.py").exists()
            or any(path.parent.glob(path.name + ".*.so")))


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for every import in ``source``, at any depth:
    ``import a.b`` is ``(n, "a.b", None)``, ``from a import b, c`` is
    ``(n, "a", "b"), (n, "a", "c")``, ``importlib.import_module("a")`` and
    ``__import__("a")`` are ``(n, "a", None)``. Relative imports are resolved
    from ``module``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, mod, a.name) for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append((node.lineno, node.args[0].value, None))
    return found


def impure_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports in ``source`` that reach TensorFlow, Keras, or a module
    of this project that is not pure (the plugin library, tensile_tf.tf,
    the runtime, ...)."""
    bad = []
    for line, mod, name in imports_of(source, module, is_package):
        target = f"{mod}.{name}" if name and is_module(f"{mod}.{name}") else mod
        top = target.split(".")[0]
        if top in FORBIDDEN_PACKAGES:
            ok = False
        elif top not in PROJECT_PACKAGES:
            ok = True
        elif target == mod and name:       # a name that is no module: an attribute of ``mod``
            ok = mod in CHECKED or mod in PURE_AT_IMPORT
        else:
            ok = target in CHECKED or target in PURE_AT_IMPORT or target in LAZY_PACKAGES
        if not ok:
            bad.append(f"line {line}: {mod}" + (f" import {name}" if name else ""))
    return bad


def test_pure_modules_import_nothing_impure_at_any_depth():
    assert {"tensile_tf.scheduler.planner", "tensile_tf.scheduler.planner_passes", "tensile_tf.config.schema",
            "tf_plugin.nodegroup.partition", "tests.scheduler.conftest"} <= set(CHECKED)
    found = {}
    for module, path in CHECKED.items():
        bad = impure_imports(path.read_text(), module, path.name == "__init__.py")
        if bad:
            found[str(path.relative_to(REPO_ROOT))] = bad
    assert not found


def test_the_scheduler_starts_no_threads():
    for module, path in CHECKED.items():
        if module.startswith("tensile_tf.scheduler"):
            names = {m.split(".")[0] for _, m, _ in imports_of(path.read_text(), module)}
            assert not names & THREAD_MODULES, (path, names & THREAD_MODULES)


@pytest.mark.parametrize("source", [
    "from tensorflow import x",
    "import tensorflow.compat.v1 as tf",
    "def f():\n    import keras\n",
    "class C:\n    def m(self):\n        from tensile_tf.runtime import replanning\n",
    "import tensile_tf.tf.pool",
    "from tensile_tf import pipeline",
    "from ..tf import pool",                      # tensile_tf.tf, from tensile_tf.scheduler.example
    "from tf_plugin import _tensile_plugin",
    "from tf_plugin import StreamAwarePool",      # a lazy attribute: loads the library
    "try:\n    import tf_keras\nexcept ImportError:\n    pass\n",
    "import importlib\nimportlib.import_module('tensorflow.python')",
])
def test_the_source_check_can_fail(source):
    assert impure_imports(source, "tensile_tf.scheduler.example")


def test_the_source_check_passes_pure_imports():
    source = textwrap.dedent("""
        import numpy as np
        import tensile_tf
        from tensile_tf.units import parse_bytes
        from . import plan
        from .plan import Plan
        from tf_plugin.nodegroup.partition import partition_graph
        from tests.conftest import REPO_ROOT
        def f():
            from sklearn.neural_network import MLPRegressor
    """)
    assert impure_imports(source, "tensile_tf.scheduler.example") == []


def test_this_tier_runs_with_tensorflow_blocked():
    assert any(isinstance(f, NoTensorFlow) for f in sys.meta_path)
    finder = NoTensorFlow()
    for name in ("tensorflow", "tensorflow.python.ops", "keras", "tf_plugin._tensile_plugin"):
        with pytest.raises(ImportError, match="not importable in the pure tier"):
            finder.find_spec(name)
    assert finder.find_spec("numpy") is None and finder.find_spec("tf_plugin.nodegroup") is None


def test_pure_packages_import_without_tensorflow():
    """A fresh interpreter, the blocker installed first: the pure packages
    import and leave no TensorFlow module behind; the runtime, which does
    need TensorFlow, fails to import (so the blocker is what holds)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import importlib, pkgutil, sys
        from tests.scheduler.conftest import NoTensorFlow, blocked_modules
        sys.meta_path.insert(0, NoTensorFlow())
        import tensile_tf, tensile_tf.scheduler, tensile_tf.config, tensile_tf.units
        import tf_plugin, tf_plugin.nodegroup.partition, tf_plugin.nodegroup.schedule
        for m in pkgutil.iter_modules(tensile_tf.scheduler.__path__, "tensile_tf.scheduler."):
            importlib.import_module(m.name)
        print(sorted(blocked_modules()), sorted(m for m in sys.modules if m.startswith("tensile_tf.scheduler."))[:2])
        try:
            import tensile_tf.runtime
        except ImportError as e:
            print("runtime:", e)
    """)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    imported, runtime = out.stdout.strip().splitlines()
    assert imported.startswith("[] ['tensile_tf.scheduler.")
    assert runtime.startswith("runtime: tensorflow") and "not importable in the pure tier" in runtime
