"""Issue 57: Note [Threads and hand-offs] (tensile_tf/runtime/threads.py) lists
every thread the package starts. A module that starts one (``threading.Thread``,
a subclass of it, or a ``ThreadPoolExecutor``) and that the note does not name
fails this test."""
import ast

from tests.conftest import REPO_ROOT

NOTE = (REPO_ROOT / "tensile_tf" / "runtime" / "threads.py").read_text().split('"""')[1]


def thread_starters(root):
    """Files under ``root`` that make a thread: a Thread(...) or ThreadPoolExecutor(...) call, or
    a class deriving from Thread."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("Thread", "ThreadPoolExecutor"):
                    found.add(path)
            elif isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if (base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")) == "Thread":
                        found.add(path)
    return found


def test_every_module_that_starts_a_thread_is_in_the_note():
    starters = thread_starters(REPO_ROOT / "tensile_tf") | thread_starters(REPO_ROOT / "tf_plugin")
    starters.discard(REPO_ROOT / "tensile_tf" / "runtime" / "threads.py")   # the primitives themselves
    assert len(starters) >= 5      # the scan finds the runtime's own threads at all
    missing = [str(p.relative_to(REPO_ROOT)) for p in starters if p.name not in NOTE]
    assert missing == [], f"threads started in modules Note [Threads and hand-offs] does not name: {missing}"


def test_the_scan_finds_a_thread_however_it_is_made(tmp_path):
    (tmp_path / "a.py").write_text("import threading\nt = threading.Thread(target=print)\n")
    (tmp_path / "b.py").write_text("from threading import Thread\nclass W(Thread):\n    pass\n")
    (tmp_path / "c.py").write_text("from concurrent.futures import ThreadPoolExecutor as P\nx = 1\n")
    (tmp_path / "d.py").write_text("import concurrent.futures\nconcurrent.futures.ThreadPoolExecutor(2)\n")
    assert {p.name for p in thread_starters(tmp_path)} == {"a.py", "b.py", "d.py"}
