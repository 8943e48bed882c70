"""The pure tier never imports TensorFlow: while this directory's test
modules are collected and while each of its tests runs, importing
tensorflow, keras or the plugin library raises ImportError, as on a machine
without them (``NoTensorFlow``). So every run of the tier proves it.

The blocker is a ``sys.meta_path`` finder, which is process-wide: it is put
in place only around this directory's collection and tests and taken out
after, so the TensorFlow tiers of a full ``pytest`` run import as usual. A
finder is asked only for modules not imported yet: where an earlier tier
imported TensorFlow already, it stops new imports (of any submodule), and
each test is also checked to have left no new such module in
``sys.modules``. This module imports nothing of the project (test_purity.py
installs the same finder in a fresh interpreter)."""
import contextlib
import importlib.abc
import sys

import pytest

BLOCKED_PACKAGES = ("tensorflow", "keras", "tf_keras")
BLOCKED_MODULES = ("tf_plugin._tensile_plugin",)   # the compiled plugin library (loads TensorFlow's)


def is_blocked(name: str) -> bool:
    return name.split(".")[0] in BLOCKED_PACKAGES or any(name == m or name.startswith(m + ".")
                                                        for m in BLOCKED_MODULES)


class NoTensorFlow(importlib.abc.MetaPathFinder):
    """Makes an import of a blocked module raise, as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if is_blocked(name):
            raise ModuleNotFoundError(f"{name} is not importable in the pure tier (tests/scheduler/conftest.py)",
                                      name=name)
        return None


def blocked_modules() -> set[str]:
    return {m for m in list(sys.modules) if is_blocked(m)}


@contextlib.contextmanager
def tensorflow_blocked():
    finder = NoTensorFlow()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Collecting this directory (importing its test modules) runs blocked.
    Called only for collectors under tests/scheduler (a conftest's
    collection hooks apply to its own directory)."""
    with tensorflow_blocked():
        return (yield)


@pytest.fixture(autouse=True)
def no_tensorflow():
    """Each test of the tier runs blocked, and imports no blocked module."""
    before = blocked_modules()
    with tensorflow_blocked():
        yield
    new = blocked_modules() - before
    assert not new, f"a pure test imported {sorted(new)}"
