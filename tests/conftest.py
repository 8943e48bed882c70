"""Test tiers:

* tests/scheduler: pure (planner, node-group partition and pairing, config).
  Never imports TensorFlow: tests/scheduler/conftest.py makes it
  unimportable while the tier is collected and run, to prove it.
* tests/pool: the standalone StreamAwarePool (the plugin library, no graphs).
* tests/nodegroup, tests/tf: TensorFlow integration (the runtime, real kernels).
* tests/e2e, tests/search: the CLI and the search drivers end to end.

Only tiers that need the runtime install it: their conftest.py calls
``install_runtime()`` at collection, before any TensorFlow op, with a pool
large enough for every in-process test (the process has one pool); tests
that need their own capacity run in a subprocess (see run_python)."""
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

# -- Hypothesis profiles -------------------------------------------------------
# "default": a short search on every run; "slow" (--run-slow): as many examples
# as the most any property asked for. Tests leave max_examples and the deadline
# to the profile (a loaded machine makes any deadline flaky).
hypothesis_settings.register_profile("default", max_examples=25, deadline=None)
hypothesis_settings.register_profile("slow", max_examples=150, deadline=None)


def pytest_configure(config):
    hypothesis_settings.load_profile("slow" if config.getoption("--run-slow") else "default")


REPO_ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TENSILE_POOL_BYTES", "3GiB")
# Cold starts in tests use the bytes-touched model, whatever `tensile calibrate`
# cached on this machine (tests that calibrate point this at their own file).
os.environ["TENSILE_LATENCY_PREDICTOR"] = str(Path("/nonexistent-tensile-test-cache") / "latency_predictor.joblib")

import tensile_tf  # noqa: E402  (light: sets TensorFlow's environment defaults, imports no TF)
from tests.forkserver import run_fresh  # noqa: E402


def install_runtime() -> None:
    """Loads TensorFlow and the plugin (the pool becomes TF's allocator)."""
    tensile_tf.install()


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (own device pool) from the repo root."""
    full_env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"}
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    full_env.update(env or {})
    # forked from an interpreter that imported TensorFlow where it can be (Note [Children forked from one import])
    return run_fresh(["-c", textwrap.dedent(code)], env=full_env, cwd=REPO_ROOT, timeout=timeout)


def last_json_line(proc: subprocess.CompletedProcess):
    """The last stdout line that parses as JSON (scripts print results last)."""
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    raise AssertionError(f"no JSON result; rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}")
