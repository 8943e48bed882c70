"""Note [Heaviest files first] (tests/conftest.py): the suite queues its files heaviest first, by
the seconds tests/file_seconds.json records, each file's tests together and in their own order,
and xdist is told to keep that order."""
import json
import tomllib

from tests.conftest import FILE_SECONDS, REPO_ROOT, heaviest_files_first, merged_file_seconds


def test_files_run_heaviest_first_each_file_whole_and_in_its_own_order():
    nodeids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t1", "tests/b.py::t2",
               "tests/d.py::t1"]
    seconds = {"tests/a.py": 1.0, "tests/b.py": 30.0, "tests/c.py": 5.0}   # d unknown: the median, 5.0
    order = [nodeids[k] for k in heaviest_files_first(nodeids, seconds)]
    assert order == ["tests/b.py::t1", "tests/b.py::t2", "tests/c.py::t1", "tests/d.py::t1",
                     "tests/a.py::t1", "tests/a.py::t2"]
    # nothing recorded: the files in the order they were first met, each whole
    assert heaviest_files_first(nodeids, {}) == [0, 2, 1, 4, 3, 5]


def test_the_recorded_seconds_name_only_test_files_that_exist_and_xdist_keeps_the_order():
    seconds = json.loads(FILE_SECONDS.read_text())
    assert seconds and all((REPO_ROOT / path).is_file() for path in seconds), \
        "tests/file_seconds.json names a file that is gone: python -m pytest --record-file-seconds"
    addopts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--dist loadfile" in addopts and "--no-loadscope-reorder" in addopts


def test_the_run_itself_was_queued_heaviest_first(request):
    """The items of this very run are in the order the function gives (the hook sorted them)."""
    ids = [item.nodeid for item in request.session.items]
    seconds = json.loads(FILE_SECONDS.read_text())
    assert [ids[k] for k in heaviest_files_first(ids, seconds)] == ids


def test_recording_a_run_of_some_files_keeps_the_others_and_drops_files_that_are_gone():
    recorded = {"tests/test_file_order.py": 1.0, "tests/conftest.py": 9.0, "tests/gone_long_ago.py": 50.0}
    merged = merged_file_seconds(recorded, {"tests/test_file_order.py": 20.04})
    assert merged == {"tests/test_file_order.py": 20.0, "tests/conftest.py": 9.0}
    assert list(merged) == ["tests/test_file_order.py", "tests/conftest.py"]    # heaviest first
