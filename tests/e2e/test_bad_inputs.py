"""Every bad input gets a clear answer (issue: bad input and interrupts).

The corpus ``bad_configs/`` holds one config per mistake; each file's header
says where the error must point (``# where:``, a piece of
``file:line:col: path``) and what it must say to do (``# says:``). Each is
validated in this process through the CLI's own entry point (``main``): exit
code 2, no traceback, the location, the remedy. The mistakes only a command
line can make (arguments, paths, the environment) run as a user runs them,
in a subprocess.
"""
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tensile_tf.cli import main
from tests.conftest import REPO_ROOT
from tests.e2e.test_cli import SMALL_CONFIG, tensile, write

CORPUS = Path(__file__).parent / "bad_configs"


def _header(path: Path, key: str) -> str:
    for line in path.read_bytes().decode("latin-1").splitlines():
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{path.name}: no '# {key}:' line")


def cli_in_process(*argv) -> tuple[int, str, str]:
    """The tensile command in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.yaml")), ids=lambda p: p.stem)
def test_each_bad_config_says_where_and_what_to_do(path):
    code, _, err = cli_in_process("validate", str(path))
    assert code == 2, err
    assert "Traceback" not in err
    where, says = _header(path, "where"), _header(path, "says")
    assert where in err, f"expected the location {where!r} in:\n{err}"
    assert says in err, f"expected {says!r} in:\n{err}"
    assert err.startswith("tensile validate: ")


def test_the_corpus_covers_every_class_of_mistake():
    classes = {p.stem.split("_")[0] for p in CORPUS.glob("*.yaml")}
    assert classes == {"yaml", "schema", "ref", "size"}
    assert len(list(CORPUS.glob("*.yaml"))) >= 30


def test_validation_of_many_jobs_resolves_each_reference_once(tmp_path):
    from tensile_tf.config import validation

    jobs = "".join(f"""
  - name: j{i}
    model: {{builder: "tensile_tf.jobs.zoo:mlp", args: {{hidden: [16]}}}}
    input_shape: [8]
    batch_size: 4
    optimizer: {{name: sgd, learning_rate: 0.5}}
    steps: 2""" for i in range(400))
    cfg = write(tmp_path, "pool: 1GiB\njobs:" + jobs + "\n")
    validation._resolve.cache_clear()
    validation._optimizer_problem.cache_clear()
    code, out, err = cli_in_process("validate", str(cfg))
    assert code == 0, err
    assert "400 jobs" in out
    assert validation._resolve.cache_info().misses == 1            # one import for 400 builders
    assert validation._optimizer_problem.cache_info().misses == 1  # one optimizer built for 400 jobs


def test_shipped_configs_pass_every_check():
    configs = sorted((REPO_ROOT / "configs").glob("*.yaml"))
    assert {"quickstart.yaml", "planner.yaml", "hybrid.yaml", "nodegroup.yaml",
            "search_quickstart.yaml"} <= {c.name for c in configs}
    for config in configs:
        code, out, err = cli_in_process("validate", str(config))
        assert code == 0, (config, err)
        assert "valid" in out, (config, out)


def test_an_argument_the_search_space_sets_counts_as_given(tmp_path):
    search = """
pool: 256MiB
search:
  n_trials: 2
  base_job:
    model: {train_step_factory: "tests.job_factories:signals_progress"}
    steps: 2
  space:
    model.args.marker: {type: categorical, choices: [a, b]}
"""
    code, out, err = cli_in_process("validate", str(write(tmp_path, search)))
    assert code == 0, err   # signals_progress requires `marker`: the space gives it to every trial
    code, out, err = cli_in_process("validate", str(write(tmp_path, search.replace("model.args.marker", "model.args.markr"))))
    assert code == 2 and "requires argument 'marker'" in err, err   # a misspelt key gives nothing


# ----------------------------------------------------------- the command line
# Refused before the runtime is installed, so in this process (the same entry point, ``main``).


def _assert_refused(result, *needles):
    code, out, err = result
    assert code == 2, out[-2000:] + err[-2000:]
    assert "Traceback" not in err + out
    for needle in needles:
        assert needle in err, err[-2000:]


def test_plan_budget_that_is_not_a_size(tmp_path):
    cfg = write(tmp_path, SMALL_CONFIG)
    _assert_refused(cli_in_process("plan", str(cfg), "--budget", "lots"),
                    "tensile plan: --budget: cannot read 'lots' as a byte size", "'512MiB'")


def test_out_naming_a_file_is_refused_before_training(tmp_path):
    cfg = write(tmp_path, SMALL_CONFIG)
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    result = cli_in_process("run", str(cfg), "--out", str(target))
    _assert_refused(result, f"--out {target}: is a file, not a folder")
    assert target.read_text() == "keep me"
    assert "cnn" not in result[1]   # nothing trained: no progress, no table


def test_missing_config_file_and_unreadable_plan(tmp_path):
    _assert_refused(cli_in_process("run", str(tmp_path / "nope.yaml")),
                    "nope.yaml: cannot read the configuration (No such file or directory)")
    cfg = write(tmp_path, SMALL_CONFIG)
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text("{not json")
    _assert_refused(cli_in_process("run", str(cfg), "--out", str(tmp_path / "o"), "--plan", str(bad_plan)),
                    "cannot read the plan", f"tensile plan {cfg}")


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception) as raised:   # --debug lets the error through, with its traceback
        cli_in_process("--debug", "validate", str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in str(raised.value)


# As a user runs them, in a subprocess: what needs the config's own pool or environment.

def _assert_user_error(proc, *needles):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in proc.stderr, proc.stderr[-2000:]


def test_bfc_allocator_variable_is_a_clear_error(tmp_path):
    cfg = write(tmp_path, SMALL_CONFIG)
    proc = tensile("run", str(cfg), "--out", str(tmp_path / "out"), env={"TF_CPU_ALLOCATOR_USE_BFC": "1"},
                   timeout=120)
    _assert_user_error(proc, "TF_CPU_ALLOCATOR_USE_BFC is set", "unset TF_CPU_ALLOCATOR_USE_BFC")


def test_run_checks_the_references_before_training(tmp_path):
    cfg = write(tmp_path, SMALL_CONFIG.replace('"tensile_tf.jobs.zoo:mlp"', '"tensile_tf.jobs.zoo:mlpp"'))
    proc = tensile("run", str(cfg), "--out", str(tmp_path / "out"), timeout=120)
    _assert_user_error(proc, "jobs[1].model.builder", "has no function 'mlpp'", "did you mean mlp")
    assert not (tmp_path / "out" / "results.json").exists()


def test_no_gpu_probe_noise_on_the_console(tmp_path):
    cfg = write(tmp_path, SMALL_CONFIG.split("  - name: mlp")[0])
    proc = tensile("run", str(cfg), "--out", str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for noise in ("cuda drivers", "cuInit", "absl::InitializeLog"):
        assert noise not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["status"] == "finished"


def test_a_large_config_validates_with_its_names_summarised(tmp_path):
    """Issue 57: a config of many jobs is parsed once (Note [Marks only for errors] in
    tensile_tf/config/yaml_nodes.py) and the valid line names a few jobs, not all; a key given
    twice deep in it is still found and placed."""
    jobs = "".join(f"  - {{name: job-{i}, model: {{builder: 'tensile_tf.jobs.zoo:mlp'}}, input_shape: [8], "
                   f"batch_size: 4, steps: 2, seed: {i}}}\n" for i in range(2000))
    path = tmp_path / "many.yaml"
    path.write_text("pool: 256MiB\njobs:\n" + jobs)
    code, out, err = cli_in_process("validate", str(path))
    assert code == 0, err
    assert "2000 jobs (job-0, job-1, job-2, job-3, job-4, ... 1994 more ..., job-1999)" in out
    path.write_text("pool: 256MiB\njobs:\n" + jobs + "  - {name: last, steps: 2, steps: 3, model: {builder: x:y}}\n")
    code, _, err = cli_in_process("validate", str(path))
    assert code == 2 and f"{path}:2003:" in err and "the key appears twice" in err, err
