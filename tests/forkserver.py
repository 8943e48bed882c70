"""Child interpreters forked from one that imported TensorFlow already.

Note [Children forked from one import]
About 90 of the suite's tests run a fresh interpreter (``tensile ...``, or code that needs its own
pool), and each spent 4-5 s importing TensorFlow and Keras before doing what it tests: a third of
the suite's time. Each pytest worker now starts one server that imports them (and nothing that
makes a pool, a device or a thread of TensorFlow's runtime), and forks it for each run. The child
is a new process, as a fresh interpreter would be: its own pool (made when it loads the plugin),
its own environment, working folder, ``sys.argv`` and output files, its exit code; it runs the
module (``-m``), code (``-c``) or script as ``__main__`` and exits as the interpreter's own exit
begins (below).
What a fork cannot give is a TensorFlow imported under another environment, so a run whose
environment differs from the server's in anything read at import (``TF_*``, thread and BLAS
settings, ``PYTHON*``; ``tensile_tf``'s own defaults counted as set), or whose ``PYTHONPATH`` adds
folders, or whose code starts processes of its own (multiprocessing), runs as a fresh interpreter,
as does every run where the server cannot start (``TENSILE_TEST_FORK=0`` asks for that).

Note [A child's exit without the teardown]
A child that ended through the interpreter's own exit spent 1.2-1.4 s after its code had ended
before the test saw it finish: measured from the child's last line to the parent, for ``print``
alone; the interpreter tearing down every module TensorFlow and Keras had loaded and collecting
them. About 90 runs in the suite paid it. A child now does what that exit does first, in its
order (``Py_FinalizeEx``): waits for its non-daemon threads (``threading._shutdown``: a thread
left running still hangs the run, as in a fresh interpreter), runs the ``atexit`` handlers, then
flushes Python's and C's output buffers and leaves with its exit code (``os._exit``): 0.01 s.
What it skips is the module teardown, its final collection and C++'s static destructors; no test
reads anything they do (the CLI's own runs in tests/e2e/test_interrupts_and_faults.py, which are
fresh interpreters, keep them).
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# read when TensorFlow and its libraries are imported: a child must see what the server saw
IMPORT_TIME = re.compile(r"^(TF_|CUDA|NVIDIA|XLA_|OMP_|KMP_|MKL|OPENBLAS|PYTHON(?!PATH$)|TENSILE_TEST_FORK)")
TENSILE_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}   # tensile_tf/__init__.py's


def _import_env(env: dict) -> dict:
    seen = {k: v for k, v in env.items() if IMPORT_TIME.match(k)}
    return TENSILE_DEFAULTS | seen


class _Server:
    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k != "TENSILE_POOL_BYTES"}
        env["PYTHONPATH"] = str(REPO_ROOT)
        self.import_env = _import_env(env)
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.forkserver import serve; serve()"],
                                     cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self._fd, self._buf = self.proc.stdout.fileno(), b""
        ready = self._line(120)
        if ready != {"ready": True}:
            raise RuntimeError(f"fork server did not start: {ready}")

    def _line(self, timeout: float):
        """The server's next reply line, read from the pipe itself (a buffered reader could hold the
        second of two lines that came at once while ``select`` waits on the empty pipe); None at timeout."""
        deadline = time.monotonic() + max(0.0, timeout)
        while b"\n" not in self._buf:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self._fd, 65536)
            if not chunk:
                return {"gone": True}
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def run(self, argv: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="tensile-fork-") as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            self.proc.stdin.write((json.dumps({"argv": argv, "env": env, "cwd": str(cwd),
                                               "out": str(out), "err": str(err)}) + "\n").encode())
            self.proc.stdin.flush()
            started = self._line(60)
            if not started or "pid" not in started:
                raise RuntimeError(f"fork server failed to fork: {started}")
            deadline = time.monotonic() + timeout
            done = self._line(deadline - time.monotonic())
            if done is None:
                os.kill(started["pid"], signal.SIGKILL)
                self._line(60)
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout,
                                                out.read_text(errors="replace"), err.read_text(errors="replace"))
            return subprocess.CompletedProcess([sys.executable, *argv], done["status"],
                                               out.read_text(errors="replace"), err.read_text(errors="replace"))


_server: _Server | None = None
_failed = False
_lock = threading.Lock()


def run_fresh(argv: list[str], *, env: dict, cwd: Path = REPO_ROOT, timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *argv], env=env, cwd=cwd, capture_output=True, text=True)``, the
    child forked from the worker's server where it can be (Note [Children forked from one import])."""
    global _server, _failed
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO_ROOT]
    script = argv[0] if argv and argv[0].endswith(".py") else None
    code = argv[1] if argv[:1] == ["-c"] and len(argv) > 1 else \
        (Path(cwd, script).read_text() if script and Path(cwd, script).is_file() else "")
    forkable = (os.environ.get("TENSILE_TEST_FORK", "1") != "0" and not paths
                and (argv[:1] in (["-c"], ["-m"]) or bool(code)) and "multiprocessing" not in code)
    with _lock:
        if forkable and not _failed:
            try:
                if _server is None:
                    _server = _Server()
                if _import_env(env) == _server.import_env:
                    return _server.run(argv, env, cwd, timeout)
            except (OSError, RuntimeError, ValueError):
                _failed = True     # a fresh interpreter for this run and every later one
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def serve() -> None:
    """The server: imports TensorFlow and Keras, then forks a child per request line."""
    import runpy
    import traceback

    import tensile_tf  # noqa: F401  (its environment defaults first, as every child's import would set them)
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import tensile_tf.cli  # noqa: F401
    import tensile_tf.config.schema  # noqa: F401

    reply = sys.stdout
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            break
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)
    else:
        return
    # the child: a fresh process's view of its own run
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    sys.stdin = open(os.devnull)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    argv = req["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] != "-c":       # a script: its folder first on the path, as the interpreter puts it
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        else:
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    _exit_without_teardown(code)


def _exit_without_teardown(code: int) -> None:
    """Note [A child's exit without the teardown]: the interpreter's exit up to its teardown."""
    import atexit
    import ctypes

    threading._shutdown()   # noqa: SLF001 - what Py_FinalizeEx does first: non-daemon threads joined
    atexit._run_exitfuncs()   # noqa: SLF001 - then the atexit handlers
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    ctypes.CDLL(None).fflush(None)   # what C code printed and stdio holds
    os._exit(code)
