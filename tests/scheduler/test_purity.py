"""The planner, the node-group partition and pairing, and the config are pure:
they import, and their whole test tier passes, in a process where importing
TensorFlow fails."""
import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT

# Makes `import tensorflow` (and keras) raise, as on a machine without them.
BLOCK_TENSORFLOW = textwrap.dedent("""
    import importlib.abc, sys
    class NoTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
                raise ImportError(f"{name} is not importable in this test")
    sys.meta_path.insert(0, NoTensorFlow())
""")


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TENSORFLOW + textwrap.dedent(code)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_pure_packages_import_without_tensorflow():
    out = _python("""
        import tensile_tf, tensile_tf.scheduler, tensile_tf.config.schema, tensile_tf.units
        import tf_plugin, tf_plugin.nodegroup.partition, tf_plugin.nodegroup.schedule
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_blocker_really_blocks_the_runtime():
    """The check above can fail: the runtime does import TensorFlow, and the
    blocker turns that into an ImportError."""
    out = _python("import tensile_tf.runtime")
    assert out.returncode != 0
    assert "tensorflow is not importable in this test" in out.stderr


def test_pure_tier_passes_without_tensorflow():
    out = _python(f"""
        import pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", {str(REPO_ROOT / "tests" / "scheduler")!r},
                              "--deselect", "tests/scheduler/test_purity.py"]))
    """, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout


def test_scheduler_sources_use_neither_tensorflow_nor_threads():
    src = "".join(p.read_text() for p in (REPO_ROOT / "tensile_tf" / "scheduler").glob("*.py"))
    assert "import tensorflow" not in src and "import threading" not in src
