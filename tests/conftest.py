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
    parser.addoption("--record-file-seconds", action="store_true",
                     help=f"write each test file's seconds to {FILE_SECONDS.relative_to(REPO_ROOT)} "
                          "(Note [Heaviest files first])")


# Note [Heaviest files first]
# The suite runs on two workers, a file whole on one (``--dist loadfile``), each worker taking the
# next file when it is done. xdist queued the files with the most tests first, so the files of
# one or two slow tests (a planned search, a packed worker, a Postgres study: 14-29 s each) came
# last, and one worker ran them while the other waited: 511.5 s against 470.2 s in a full run.
# Files are now queued heaviest first, by the seconds tests/file_seconds.json records for them
# (a file it does not know counts as its median), and xdist keeps that order
# (``--no-loadscope-reorder`` in pyproject's addopts, pytest-xdist 3.8): the last files queued are the short ones.
# ``python -m pytest --record-file-seconds`` writes the file again from a run.
FILE_SECONDS = REPO_ROOT / "tests" / "file_seconds.json"


def heaviest_files_first(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """The order (indices into ``nodeids``) that runs the files heaviest first, each file's tests
    together and in their own order; files of equal weight in their first test's order."""
    known = sorted(seconds.values())
    default = known[len(known) // 2] if known else 0.0
    first: dict[str, int] = {}
    for k, nodeid in enumerate(nodeids):
        first.setdefault(nodeid.split("::")[0], k)
    def key(k: int) -> tuple[float, int, int]:
        path = nodeids[k].split("::")[0]
        return -seconds.get(path, default), first[path], k
    return sorted(range(len(nodeids)), key=key)


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    items[:] = [items[k] for k in heaviest_files_first([item.nodeid for item in items], seconds)]
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.nodeid:
        path = report.nodeid.split("::")[0]
        _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def merged_file_seconds(recorded: dict[str, float], ran: dict[str, float]) -> dict[str, float]:
    """The seconds kept: the files that ran at their new time, the others as recorded (a run of
    some files leaves the rest), files that are gone dropped; heaviest first."""
    kept = {path: s for path, s in {**recorded, **ran}.items() if (REPO_ROOT / path).is_file()}
    return {path: round(s, 1) for path, s in sorted(kept.items(), key=lambda kv: -kv[1])}


def pytest_sessionfinish(session):
    worker = hasattr(session.config, "workerinput")    # xdist's controller hears every worker's reports
    if session.config.getoption("--record-file-seconds") and not worker and _file_seconds:
        recorded = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
        FILE_SECONDS.write_text(json.dumps(merged_file_seconds(recorded, _file_seconds), indent=1) + "\n")


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
