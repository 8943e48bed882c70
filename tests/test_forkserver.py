"""Note [A child's exit without the teardown] (tests/forkserver.py): a forked child ends as the
interpreter's exit would, up to its teardown: non-daemon threads joined first, then the atexit
handlers, what Python and C printed flushed, its exit code kept."""
import pytest

from tests.conftest import run_python

CHILD = r"""
import atexit, ctypes, sys, threading, time
print("forked" if "tensorflow" in sys.modules else "fresh", flush=True)   # the server imported it
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
ctypes.CDLL(None).printf(b"from C, unflushed ")
sys.exit(3)
"""


def test_a_forked_child_joins_its_threads_runs_atexit_flushes_c_output_and_keeps_its_exit_code():
    proc = run_python(CHILD)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 3, proc.stderr[-2000:]
    if lines[:1] == ["fresh"]:   # TENSILE_TEST_FORK=0, or a PYTHONPATH beside the repository's
        pytest.skip("children run as fresh interpreters here (Note [Children forked from one import])")
    assert lines[0] == "forked", lines   # the path under test
    out = proc.stdout   # (C's buffer comes out where stdio flushed it, not in print order)
    assert "thread done" in out and out.index("thread done") < out.index("atexit ran"), out   # Py_FinalizeEx's order
    assert "from C, unflushed" in out, out
